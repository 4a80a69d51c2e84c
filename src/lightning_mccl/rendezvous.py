"""A rendezvous that says who is missing: torch's TCPStore, with arrivals tracked and reported.

torch's own ``env://`` rendezvous blocks rank 0 inside the TCPStore constructor until every rank has
connected, for the whole group timeout (30 minutes by default), saying nothing; it then fails with
``Timed out after ... waiting for clients. 1/2 clients joined``, which names no one, and while it waits the
rank ignores Ctrl-C (the wait is in C++). `rendezvous` builds the same store, but:

- rank 0 starts the store without waiting for anyone; every rank connects (a rank > 0 first waits, in
  Python, until the store's port accepts a connection) and records its arrival under ``mccl/rdzv/<n>/<rank>``
  with its host name, where n is the round rank 0's new store names (a random id); a rank that comes to a
  second group while rank 0 still holds the first one's store finds its own arrival already there (that round
  is behind it), and waits for the new store;
- every rank then waits, in Python, until all ranks have arrived: Ctrl-C stops it at once;
- after ``report_s`` seconds (MCCL_RENDEZVOUS_REPORT_S, default 10) and every ``report_s`` seconds after,
  rank 0 prints which ranks have not arrived, with their hosts when the launcher said (MCCL_HOSTS, set by
  `mccl launch`), and a rank > 0 that cannot reach rank 0's store says so;
- when the group timeout passes first, every waiting rank raises `RendezvousError` naming the missing
  ranks and hosts.

The store returned is the one torch's ``init_process_group(store=...)`` takes (`MCCLStrategy` passes it).
"""
from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from datetime import timedelta
from typing import Callable, List, Optional, Sequence

import torch.distributed as dist

REPORT_VAR = "MCCL_RENDEZVOUS_REPORT_S"
REPORT_S = 10.0  # default of MCCL_RENDEZVOUS_REPORT_S: first report, and the interval between reports
HOSTS_VAR = "MCCL_HOSTS"  # set by `mccl launch`: the host names in node order
CONNECT_ATTEMPT_S = 1.0  # one attempt of a rank > 0 to reach the store's port
PROBE_INTERVAL_S = 0.2  # between such attempts
POLL_S = 0.05
HAND_OUT_S = 2.0  # how long rank 0, timed out, waits for the waiting ranks to read its message
OPEN_KEY = "mccl/rdzv/open"  # the round rank 0's store serves (a random id), set as it opens


class RendezvousError(RuntimeError):
    """The ranks did not all arrive at the rendezvous within the timeout (the message names the missing)."""


def report_interval(environ=None) -> float:
    environ = os.environ if environ is None else environ
    text = environ.get(REPORT_VAR, "")
    if text == "":
        return REPORT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{REPORT_VAR}={text!r} is not a positive number of seconds (default {REPORT_S:g})")
    return value


def launcher_hosts(world_size: int, environ=None) -> Optional[List[str]]:
    """The host of every rank, from `mccl launch`'s MCCL_HOSTS and LOCAL_WORLD_SIZE; None when unknown."""
    environ = os.environ if environ is None else environ
    names = [n for n in environ.get(HOSTS_VAR, "").split(",") if n]
    try:
        per_host = int(environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError:
        return None
    if not names or per_host < 1 or len(names) * per_host != world_size:
        return None
    return [names[r // per_host] for r in range(world_size)]


def describe_ranks(ranks: Sequence[int], hosts: Optional[Sequence[str]]) -> str:
    """"rank 2 (host mac-3), rank 3 (host mac-4)", or "ranks 2, 3" without hosts."""
    if hosts is None:
        return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
    return ", ".join(f"rank {r} (host {hosts[r]})" for r in ranks)


def _say(rank: int, message: str) -> None:
    sys.stderr.write(f"mccl rendezvous (rank {rank}): {message}\n")
    sys.stderr.flush()


def _await_port(addr: str, port: int, rank: int, deadline: float, timeout: float, report_s: float,
                say: Callable[[str], None]) -> None:
    """Until rank 0's store accepts connections, probe it with a plain socket: a TCPStore client retrying by
    itself logs a warning with C++ frames on every failed attempt, and cannot be interrupted."""
    start = deadline - timeout
    next_report = time.monotonic() + report_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((addr, port), timeout=max(0.1, min(CONNECT_ATTEMPT_S, left))):
                return
        except OSError as e:
            waited = time.monotonic() - start
            if waited >= timeout:
                raise RendezvousError(
                    f"rank {rank} could not reach rank 0's rendezvous at {addr}:{port} within {timeout:g} s "
                    f"(the group timeout): is rank 0 running, is MASTER_ADDR right, and does a firewall let "
                    f"port {port} through? Last error: {e.strerror or e}") from None
            if time.monotonic() >= next_report:
                say(f"cannot reach rank 0 at {addr}:{port} yet ({e.strerror or e}; {waited:.0f} s of {timeout:g} s)")
                next_report += report_s
            time.sleep(PROBE_INTERVAL_S)


def _round_served(store, deadline: float) -> Optional[str]:
    """The rendezvous round rank 0's store says it serves (OPEN_KEY); None if it says none by the deadline."""
    while time.monotonic() < deadline:
        if store.check([OPEN_KEY]):
            return store.get(OPEN_KEY).decode()
        time.sleep(POLL_S)
    return None


def _connect(addr: str, port: int, rank: int, world_size: int, timeout: float, report_s: float,
             say: Callable[[str], None]):
    """Rank 0: a new store serving a new round. A rank > 0: a client of that store. Returns (store, round).

    A rank > 0 can come to the port while rank 0's store of the round before still serves it: the ranks
    destroyed their group, and rank 0 has not yet released the store that group held. This rank's arrival is
    already recorded in that store's round; the rank leaves it and tries again until rank 0's new store (same
    port) serves a round it has not arrived at."""
    if rank == 0:
        store = dist.TCPStore(addr, port, world_size, True, timedelta(seconds=timeout), wait_for_workers=False,
                              multi_tenant=True)
        round_ = uuid.uuid4().hex
        store.set(OPEN_KEY, round_)
        return store, round_
    deadline = time.monotonic() + timeout
    served = None
    while time.monotonic() < deadline:
        _await_port(addr, port, rank, deadline, timeout, report_s, say)
        try:
            store = dist.TCPStore(addr, port, world_size, False,
                                  timedelta(seconds=max(deadline - time.monotonic(), 1.0)), wait_for_workers=False)
            served = _round_served(store, deadline)
            if served is not None and not store.check([f"mccl/rdzv/{served}/{rank}"]):
                return store, served
        except dist.DistError:  # the earlier round's store closed while this rank connected to it
            continue
        del store  # rank 0's store of an earlier round, about to close
        time.sleep(PROBE_INTERVAL_S)
    raise RendezvousError(
        f"rank 0's store at {addr}:{port} still served the rendezvous of this rank's previous process group after "
        f"{timeout:g} s (the group timeout): did rank 0 make its next process group?" if served is not None else
        f"rank 0's store at {addr}:{port} named no rendezvous within {timeout:g} s (the group timeout): is "
        f"another program serving port {port}?")


def _hand_out(store, prefix: str, verdict: str, message: str, waiting: Sequence[int]) -> None:
    """Rank 0's timeout message, left in its store for the ranks still waiting, which acknowledge it
    (briefly awaited: the store ends with rank 0's process)."""
    store.set(verdict, message)
    deadline = time.monotonic() + HAND_OUT_S
    while waiting and time.monotonic() < deadline and not store.check([f"{prefix}ack/{r}" for r in waiting]):
        time.sleep(POLL_S)


def rendezvous(addr: str, port: int, rank: int, world_size: int, timeout: timedelta, *,
               report_s: Optional[float] = None, hosts: Optional[Sequence[str]] = None,
               say: Optional[Callable[[str], None]] = None) -> dist.TCPStore:
    """The store every rank of the group shares, once all `world_size` ranks have arrived (see the module
    docstring). Raises RendezvousError after `timeout`; KeyboardInterrupt on Ctrl-C while waiting."""
    report_s = report_interval() if report_s is None else report_s
    hosts = launcher_hosts(world_size) if hosts is None else hosts
    say = say if say is not None else (lambda message: _say(rank, message))
    limit = timeout.total_seconds()
    start = time.monotonic()
    store, round_ = _connect(addr, port, rank, world_size, limit, report_s, say)
    prefix = f"mccl/rdzv/{round_}/"
    store.set(prefix + str(rank), socket.gethostname())
    keys = [prefix + str(r) for r in range(world_size)]
    verdict = prefix + "verdict"
    next_report = start + report_s
    try:
        while not store.check(keys):
            now = time.monotonic()
            if rank != 0 and store.check([verdict]):  # rank 0 gave up: its message, acknowledged
                store.set(f"{prefix}ack/{rank}", "1")
                raise RendezvousError(store.get(verdict).decode())
            if now - start >= limit or (rank == 0 and now >= next_report):
                missing = [r for r in range(world_size) if not store.check([keys[r]])]
                if not missing:
                    break
                who = describe_ranks(missing, hosts)
                if now - start >= limit:
                    message = (
                        f"{who} did not reach the rendezvous at {addr}:{port} within {limit:g} s (the group "
                        f"timeout; MCCLStrategy(timeout=...)); {world_size - len(missing)} of {world_size} ranks "
                        f"arrived. Was {'it' if len(missing) == 1 else 'each'} started, and did it fail before "
                        f"reaching the rendezvous (see its output)?")
                    if rank == 0:
                        _hand_out(store, prefix, verdict, message, [r for r in range(1, world_size) if r not in missing])
                    raise RendezvousError(message)
                say(f"waiting for {len(missing)} of {world_size} ranks after {now - start:.0f} s "
                    f"(timeout {limit:g} s): {who}")
                next_report += report_s
            time.sleep(POLL_S)
    except dist.DistError as e:  # rank 0's store is gone (DistNetworkError) or broken
        raise RendezvousError(
            f"rank 0's rendezvous store at {addr}:{port} went away while rank {rank} waited for the others "
            f"(rank 0 exited or crashed: see its output): {str(e).splitlines()[0]}") from None
    store.set_timeout(timeout)
    return store


__all__ = ["rendezvous", "RendezvousError", "launcher_hosts", "describe_ranks", "REPORT_S", "REPORT_VAR"]
