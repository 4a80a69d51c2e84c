"""A `Cluster`: a world of rank processes (`world`) that the reliability harnesses can hurt.

This process hosts the c10d TCPStore (so it survives any rank's death, and the harness can read what the
ranks publish in it, such as their mccl listen addresses); every rank runs a module-level function
`fn(chan, **kwargs)` and talks to the harness through `chan` (a `RankChannel`: `send(kind, **fields)`,
`wait_for`, `store()`, `init_process_group()`). An exception the function lets escape is sent as an
"uncaught" event (type, message, traceback) and the rank exits with code 1.

The harness owns every deadline: `Cluster.close()` SIGKILLs whatever is still alive (a SIGSTOP'd rank
included), so a trial can end however badly the ranks behave and nothing outlives it.
"""
from __future__ import annotations

import os
import signal
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Optional

from ..launcher import free_port
from .world import HOST, RankChannel, RankWorld, now


def cluster_rank(fn, chan: RankChannel, **kwargs) -> int:
    """A rank of a Cluster (the adapter `world.rank_main` calls): fn(chan, **kwargs); 1 after an exception."""
    try:
        fn(chan, **kwargs)
        return 0
    except BaseException as e:  # noqa: BLE001 - reported to the harness, which decides
        chan.send("uncaught", type=type(e).__name__, message=str(e)[:4000], traceback=traceback.format_exc()[-4000:])
        return 1


class Cluster:
    """`world` rank processes running `fn`, a TCPStore hosted here, and their events.

    events: list of (rank, kind, fields) in arrival order. `stderr_path`: where the ranks' stderr goes
    (the engine logs there); None inherits the harness's. `env`: the trial's variables, set in each rank
    before anything reads them.
    """

    def __init__(self, fn, world: int, *, pg_timeout_s: float, kwargs: Optional[dict] = None,
                 stderr_path: Optional[str] = None, env: Optional[dict] = None):
        import torch.distributed as dist

        self.world = world
        self.pg_timeout_s = pg_timeout_s
        self.store_port = free_port(HOST)
        self.store = dist.TCPStore(HOST, self.store_port, None, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=max(30.0, pg_timeout_s)))
        self.events: list = []
        self.stopped: set = set()
        self._stacks = tempfile.TemporaryDirectory(prefix="mccl-cluster-")
        try:
            self._world = RankWorld(cluster_rank, fn, world, pg_timeout_s=pg_timeout_s, env=env,
                                    store_port=self.store_port, stderr_path=stderr_path, options=kwargs,
                                    stack_dir=self._stacks.name)
        except BaseException:
            self._stacks.cleanup()
            raise
        self.procs = self._world.procs

    # -- events ---------------------------------------------------------------------------------------------

    def poll(self, timeout: float) -> list:
        """Collects events for up to `timeout` s (returns early when some arrive); returns the new ones."""
        new = self._world.poll(timeout)
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
        self._world.tell(rank, kind, payload)

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
        self._world.close()
        self._stacks.cleanup()

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
