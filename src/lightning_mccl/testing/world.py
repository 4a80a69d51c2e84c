"""Rank processes on this machine, for the tests and the benchmarks: the one harness both use.

A `RankWorld` starts `world` processes, each running a module-level function of the caller's (imported by
name in the rank) through an adapter (`run_ranks`, `cluster`), and talks to each over a duplex pipe: the
rank sends ``(kind, payload)`` events through its `RankChannel`, the harness can answer with `tell`. The
harness owns every deadline: `kill()` ends whatever is still alive (SIGTERM, then SIGKILL; a SIGSTOP'd rank
included), and `dump_stacks()` first asks hung ranks for their Python stacks (SIGUSR1, faulthandler).

Ranks are forks of one fork server that imported torch and lightning_mccl once (`PRELOAD`): a world of 8
ranks starts in a fraction of a second instead of the seconds that 8 fresh interpreters need. Everything
else starts fresh in the rank: its environment is the caller's at the call (plus the extra variables), not
the fork server's, and its sys.path the caller's. lightning_mccl reads no variable when it is imported: the
engine reads its settings when a group is made and MCCL_DEBUG at its first log line, both in the rank.
"""
from __future__ import annotations

import faulthandler
import functools
import importlib
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Dict, List, Optional, Sequence, Tuple

HOST = "127.0.0.1"
# What the fork server imports once for every rank. torch._dynamo is what DDP's constructor imports (2-3 s
# of CPU in each rank that makes a DDP model).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "numpy", "lightning_mccl"]
KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL
STACK_LINES = 60  # of a hung rank's Python stacks, in a report


@functools.lru_cache(maxsize=None)
def forkserver_context():
    """The fork-server context of every world, with PRELOAD (the server starts with the first world)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def context_started() -> bool:
    """Whether a world was started in this process (so the fork server's environment is already fixed)."""
    return forkserver_context.cache_info().currsize > 0


def now() -> float:
    """CLOCK_MONOTONIC: one clock for every process of this machine, so rank and harness times compare."""
    return time.monotonic()


def function_ref(fn) -> Tuple[str, str]:
    """(module, qualified name) of a module-level function, for a rank to import it by name."""
    if getattr(fn, "__module__", "__main__") == "__main__" or "<locals>" in fn.__qualname__:
        raise ValueError(f"{fn.__qualname__}: the harness needs a module-level function (a rank imports it by name)")
    return fn.__module__, fn.__qualname__


def _resolve(ref: Tuple[str, str]):
    obj = importlib.import_module(ref[0])
    for part in ref[1].split("."):
        obj = getattr(obj, part)
    return obj


class RankChannel:
    """What a rank's function gets (or its adapter): its rank, the world, the harness's store port (None: none),
    the process group timeout, and the pipe: `post(kind, payload)`, `send(kind, **fields)` (an event that
    also carries `t`, CLOCK_MONOTONIC when it was sent) and `wait_for(kind, timeout)`."""

    def __init__(self, conn, rank: int, world: int, store_port: Optional[int], pg_timeout_s: float):
        self.conn, self.rank, self.world = conn, rank, world
        self.store_port, self.pg_timeout_s = store_port, pg_timeout_s

    def post(self, kind: str, payload=None) -> bool:
        """Sends (kind, payload); False when it could not (the harness is gone or closed the pipe)."""
        try:
            self.conn.send((kind, payload))
            return True
        except (OSError, ValueError):
            return False

    def send(self, kind: str, **fields) -> None:
        fields.setdefault("t", now())
        self.post(kind, fields)

    def wait_for(self, kind: str, timeout: float):
        """Blocks until the harness sends (kind, payload); returns the payload (default True; None on
        timeout, end of file, or another message)."""
        if not self.conn.poll(timeout):
            return None
        try:
            got, payload = self.conn.recv()
        except (EOFError, OSError):
            return None
        return payload if got == kind else None

    def store(self, timeout_s: Optional[float] = None):
        """A client of the harness's TCPStore (a `Cluster`'s)."""
        import torch.distributed as dist

        return dist.TCPStore(HOST, self.store_port, None, is_master=False,
                             timeout=timedelta(seconds=timeout_s or self.pg_timeout_s))

    def init_process_group(self, store=None) -> None:
        import torch.distributed as dist

        store = store if store is not None else self.store()
        dist.init_process_group("mccl", store=store, rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=self.pg_timeout_s))


def rank_main(adapter_ref, fn_ref, rank: int, world: int, conn, setup: dict) -> None:
    """A rank process: the caller's environment and sys.path, stderr to setup["stderr_path"] when given, its
    Python stacks to setup["stack_path"] on SIGUSR1; then adapter(fn, chan) returns the exit code. No
    interpreter teardown: a process group's destructor may wait on peers that are gone, and the rank has
    reported what it had to through its pipe."""
    if setup.get("stderr_path"):
        fd = os.open(setup["stderr_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    os.environ.clear()
    os.environ.update(setup["environ"])
    sys.path[:] = setup["path"]
    stack_file = open(setup["stack_path"], "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    chan = RankChannel(conn, rank, world, setup.get("store_port"), setup["pg_timeout_s"])
    code = 1
    try:
        import torch

        torch.set_num_threads(1)
        code = _resolve(adapter_ref)(_resolve(fn_ref), chan, **setup.get("options", {}))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class RankWorld:
    """`world` rank processes (or only `ranks` of them) running `fn` through `adapter` (module-level
    functions both); `env`: extra variables on top of this process's environment; `options`: keyword
    arguments of the adapter. See the module docstring."""

    def __init__(self, adapter, fn, world: int, *, pg_timeout_s: float, env: Optional[Dict[str, str]] = None,
                 ranks: Optional[Sequence[int]] = None, store_port: Optional[int] = None,
                 stderr_path: Optional[str] = None, options: Optional[dict] = None, stack_dir: str):
        self.world = world
        self.ranks = list(range(world)) if ranks is None else list(ranks)
        self.procs: Dict[int, mp.Process] = {}
        self.conns: Dict[int, Optional[mpc.Connection]] = {}
        self.stack_paths = {r: os.path.join(stack_dir, f"rank{r}.stack") for r in self.ranks}
        ctx = forkserver_context()
        refs = (function_ref(adapter), function_ref(fn))
        environ = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
        try:
            for rank in self.ranks:
                here, there = ctx.Pipe(duplex=True)
                setup = dict(environ=environ, path=list(sys.path), stack_path=self.stack_paths[rank],
                             stderr_path=stderr_path, store_port=store_port, pg_timeout_s=pg_timeout_s,
                             options=options or {})
                p = ctx.Process(target=rank_main, args=(*refs, rank, world, there, setup), name=f"mccl-rank{rank}",
                                daemon=True)
                p.start()
                there.close()
                self.procs[rank] = p
                self.conns[rank] = here
        except BaseException:
            self.kill()
            raise

    def poll(self, timeout: float) -> List[Tuple[int, str, object]]:
        """(rank, kind, payload) of the events that arrive within `timeout` s (returns early when some do); a
        rank's pipe that reached its end is closed (its entry in `conns` becomes None)."""
        new = []
        live = {c: r for r, c in self.conns.items() if c is not None}
        if not live:
            time.sleep(max(0.0, timeout))
            return new
        for c in mpc.wait(list(live), timeout=max(0.0, timeout)):
            r = live[c]
            try:
                while c.poll():
                    kind, payload = c.recv()
                    new.append((r, kind, payload))
            except (EOFError, OSError):
                c.close()
                self.conns[r] = None
        return new

    def tell(self, rank: int, kind: str, payload=True) -> None:
        c = self.conns.get(rank)
        if c is not None:
            try:
                c.send((kind, payload))
            except (OSError, ValueError):
                pass

    def alive(self) -> List[int]:
        return [r for r, p in self.procs.items() if p.exitcode is None]

    def dump_stacks(self, ranks: Sequence[int]) -> Dict[int, str]:
        """The Python stacks of `ranks` (SIGUSR1 -> faulthandler), indented, at most STACK_LINES each."""
        for r in ranks:
            try:
                os.kill(self.procs[r].pid, signal.SIGUSR1)
            except (ProcessLookupError, TypeError):
                pass
        if ranks:
            time.sleep(1.0)
        out = {}
        for r in ranks:
            try:
                with open(self.stack_paths[r]) as f:
                    lines = f.read().strip().splitlines()
            except OSError:
                lines = []
            if len(lines) > STACK_LINES:
                lines = lines[:STACK_LINES] + [f"... ({len(lines) - STACK_LINES} more lines)"]
            out[r] = "\n".join("    " + line for line in lines) or "    (no stack was written)"
        return out

    def kill(self, grace: float = KILL_GRACE_S) -> None:
        """SIGTERM to every live rank, SIGKILL `grace` s later (at once with 0: also a stopped rank), reaped."""
        alive = [p for p in self.procs.values() if p.exitcode is None]
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)) if grace > 0 else ((signal.SIGKILL, 10.0),):
            deadline = time.monotonic() + wait
            for p in alive:
                if p.exitcode is None:
                    try:
                        os.kill(p.pid, sig)
                    except (ProcessLookupError, TypeError):
                        pass
            for p in alive:
                p.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """kill(0) and close every pipe."""
        self.kill(0)
        for c in self.conns.values():
            if c is not None:
                c.close()
        self.conns = {r: None for r in self.conns}
