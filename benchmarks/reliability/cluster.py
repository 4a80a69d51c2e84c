"""A world of rank processes that the reliability harnesses can hurt.

The harness process hosts the c10d TCPStore (so it survives any rank's death, and the harness can read
what the ranks publish in it, such as their mccl listen addresses), and starts one process per rank from
a fork server that has already imported torch and lightning_mccl: a world of 8 ranks starts in a fraction
of a second instead of the seconds 8 fresh interpreters need, which is what makes hundreds of trials
affordable on a small machine. Every rank runs a module-level function `fn(rank, world, conn, **kwargs)`
and talks to the harness through `conn` (see `RankChannel`).

The harness owns every deadline: `Cluster.close()` SIGKILLs whatever is still alive (a SIGSTOP'd rank
included), so a trial can end however badly the ranks behave and nothing outlives it.
"""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import socket
import sys
import time
from datetime import timedelta

import torch.distributed as dist

HOST = "127.0.0.1"
# Imported once by the fork server; every rank is a fork of it.
PRELOAD = ["torch", "torch.distributed", "numpy", "lightning_mccl"]
_ctx = None


def context():
    """The forkserver context, with torch and lightning_mccl preloaded (started on first use)."""
    global _ctx
    if _ctx is None:
        here = os.path.dirname(os.path.abspath(__file__))
        parent = os.path.dirname(here)
        if parent not in sys.path:  # the fork server imports rank functions by module name
            sys.path.insert(0, parent)
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(PRELOAD)
    return _ctx


def context_started() -> bool:
    return _ctx is not None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the small race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def now() -> float:
    """CLOCK_MONOTONIC: one clock for every process of this machine, so rank and harness times compare."""
    return time.monotonic()


# ----------------------------------------------------------------------------------------------------------
# Rank side


class RankChannel:
    """What a rank function gets: its rank, the world, the store address, and `send(kind, **fields)`.

    Every event carries `t` (CLOCK_MONOTONIC when it was sent). An exception the rank function lets
    escape is sent as an "uncaught" event (type, message, traceback) and the process exits with code 1."""

    def __init__(self, conn, rank, world, store_port, pg_timeout_s):
        self.conn, self.rank, self.world = conn, rank, world
        self.store_port, self.pg_timeout_s = store_port, pg_timeout_s

    def send(self, kind: str, **fields) -> None:
        fields.setdefault("t", now())
        try:
            self.conn.send((kind, fields))
        except (OSError, ValueError):  # the harness is gone or closed the pipe: nothing left to tell
            pass

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

    def store(self, timeout_s: float | None = None):
        return dist.TCPStore(HOST, self.store_port, None, is_master=False,
                             timeout=timedelta(seconds=timeout_s or self.pg_timeout_s))

    def init_process_group(self, store=None):
        import lightning_mccl  # noqa: F401  (registers the backend; preloaded by the fork server)

        store = store if store is not None else self.store()
        dist.init_process_group("mccl", store=store, rank=self.rank, world_size=self.world,
                                timeout=timedelta(seconds=self.pg_timeout_s))


def _rank_main(fn_ref, rank, world, store_port, pg_timeout_s, kwargs, env, conn):
    import importlib
    import traceback

    import torch

    # Ranks are forks of the fork server, whose environment is the harness's at the time it started: the
    # trial's variables are set here, before the engine reads its configuration (at the first communicator).
    os.environ.update(env)
    torch.set_num_threads(1)
    chan = RankChannel(conn, rank, world, store_port, pg_timeout_s)
    module, name = fn_ref
    code = 0
    try:
        getattr(importlib.import_module(module), name)(chan, **kwargs)
    except BaseException as e:  # noqa: BLE001 - reported to the harness, which decides
        chan.send("uncaught", type=type(e).__name__, message=str(e)[:4000], traceback=traceback.format_exc()[-4000:])
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: a process group's destructor may wait on peers that are gone, and a trial has
    # already reported everything it measured.
    os._exit(code)


# ----------------------------------------------------------------------------------------------------------
# Harness side


class Cluster:
    """`world` rank processes running `fn`, a TCPStore hosted here, and their event pipes.

    events: list of (rank, kind, fields) in arrival order. `stderr_path`: where the ranks' stderr goes
    (the engine logs there); None inherits the harness's.
    """

    def __init__(self, fn, world: int, *, pg_timeout_s: float, kwargs: dict | None = None,
                 stderr_path: str | None = None, env: dict | None = None):
        self.world = world
        self.pg_timeout_s = pg_timeout_s
        self.store_port = free_port()
        self.store = dist.TCPStore(HOST, self.store_port, None, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=max(30.0, pg_timeout_s)))
        self.events: list = []
        self.procs: dict = {}
        self.conns: dict = {}
        self.stopped: set = set()
        ctx = context()
        fn_ref = (fn.__module__, fn.__name__)
        env = {k: str(v) for k, v in (env or {}).items()}
        try:
            for rank in range(world):
                here, there = ctx.Pipe(duplex=True)
                # The fork server's children inherit its fds, not ours: a rank re-opens stderr_path itself.
                target = _rank_main if stderr_path is None else _rank_with_stderr
                args = (fn_ref, rank, world, self.store_port, pg_timeout_s, kwargs or {}, env,
                        there)
                if stderr_path is not None:
                    args = (stderr_path,) + args
                p = ctx.Process(target=target, args=args, name=f"rank{rank}", daemon=True)
                p.start()
                there.close()
                self.procs[rank] = p
                self.conns[rank] = here
        except BaseException:
            self.close()
            raise

    # -- events ---------------------------------------------------------------------------------------------

    def poll(self, timeout: float) -> list:
        """Collects events for up to `timeout` s (returns early when some arrive); returns the new ones."""
        new = []
        live = {c: r for r, c in self.conns.items() if c is not None}
        if not live:
            time.sleep(max(0.0, timeout))
            return new
        for c in mpc.wait(list(live), timeout=max(0.0, timeout)):
            r = live[c]
            try:
                while c.poll():
                    kind, fields = c.recv()
                    new.append((r, kind, fields))
            except (EOFError, OSError):
                c.close()
                self.conns[r] = None
        self.events.extend(new)
        return new

    def wait_until(self, predicate, deadline: float) -> bool:
        """Polls events until predicate(self) is true (True) or `deadline` (monotonic) passes (False)."""
        while True:
            if predicate(self):
                return True
            left = deadline - now()
            if left <= 0:
                return False
            self.poll(min(0.2, left))

    def latest(self, rank: int, kind: str):
        for r, k, f in reversed(self.events):
            if r == rank and k == kind:
                return f
        return None

    def ranks_with(self, kind: str) -> set:
        return {r for r, k, _ in self.events if k == kind}

    def tell(self, rank: int, kind: str, payload=True) -> None:
        c = self.conns.get(rank)
        if c is not None:
            try:
                c.send((kind, payload))
            except (OSError, ValueError):
                pass

    # -- processes ------------------------------------------------------------------------------------------

    def pid(self, rank: int) -> int:
        return self.procs[rank].pid

    def signal(self, rank: int, sig: int) -> float:
        """Sends `sig` to rank's process; returns when (monotonic)."""
        t = now()
        os.kill(self.pid(rank), sig)
        if sig == signal.SIGSTOP:
            self.stopped.add(rank)
        return t

    def exited(self, rank: int) -> bool:
        return self.procs[rank].exitcode is not None

    def exitcode(self, rank: int):
        return self.procs[rank].exitcode

    def listen_address(self, rank: int, timeout_s: float = 0.0):
        """The address rank published for its mccl listener (None when not (yet) there)."""
        deadline = now() + timeout_s
        while True:
            key = find_mccl_key(self.store, f"mccl/addr/{rank}")
            if key is not None:
                return self.store.get(key).decode()
            if now() >= deadline:
                return None
            time.sleep(0.01)

    def close(self) -> None:
        """SIGKILLs every rank still alive (stopped ones too) and reaps them."""
        for p in self.procs.values():
            if p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except (ProcessLookupError, TypeError):
                    pass
        for p in self.procs.values():
            p.join(10.0)
        for c in self.conns.values():
            if c is not None:
                c.close()
        self.conns = {r: None for r in self.conns}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def find_mccl_key(store, key: str):
    """The full name of the mccl backend's `key` in `store`, or None while it is not there.

    torch wraps the store it gives a backend in PrefixStore(f"{group}/") and PrefixStore(f"{device}/"), and a
    PrefixStore joins prefix and key with one more "/": the default group's cpu backend (the first group of a
    process) writes "mccl/addr/1" as "0//cpu//mccl/addr/1". Rather than rely on that, the store's key list is
    searched for the one key that ends with "//" + key (the first group's, if several groups published one).
    """
    matches = sorted((k for k in store.list_keys() if k.endswith("//" + key)), key=len)
    return matches[0] if matches else None


def _rank_with_stderr(stderr_path, *args):
    fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    _rank_main(*args)
