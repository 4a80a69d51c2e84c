"""`run_ranks(fn, world_size)`: the torch.distributed tests' way to run a function on every rank.

It starts one process per rank (`world`), initialises the process group in each (TCP rendezvous on a free
localhost port), runs `fn(rank, world_size, *args)`, destroys the group and hands back every rank's result.
The parent owns the deadline: a rank that does not finish in time is killed and the call raises `RunFailed`
(an AssertionError) naming it and what it was doing (`progress`), with its Python stacks, so a bug in the
backend shows up as a test failure, never as a hung test run.

The backend is chosen by the environment variable MCCL_TEST_BACKEND (default "mccl"); "gloo" runs the same
tests against PyTorch's Gloo backend, which is how the tests themselves are validated.

Results travel through the rank's pipe, so they must be picklable; torch tensors are converted to numpy
arrays before they are sent (bfloat16 as float32, which is exact).
"""
from __future__ import annotations

import contextvars
import importlib
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Dict, List, Optional

from ..launcher import free_port
from .world import RankChannel, RankWorld

DEFAULT_BACKEND = "mccl"
# After one rank has failed, how long the others get to finish (they may be stuck in a collective with
# the failed rank) before they are killed and the failure is reported.
FAILURE_GRACE_S = 15.0
# The channel of the rank this process is (set in the rank, before `fn` runs; unset in the parent).
CHANNEL: contextvars.ContextVar = contextvars.ContextVar("lightning_mccl_testing_channel")


def backend_name() -> str:
    """The backend under test: $MCCL_TEST_BACKEND, default "mccl"."""
    return os.environ.get("MCCL_TEST_BACKEND", DEFAULT_BACKEND).strip() or DEFAULT_BACKEND


def is_gloo(backend: Optional[str] = None) -> bool:
    return (backend or backend_name()) == "gloo"


def progress(label: str) -> None:
    """Tell the parent what this rank is doing now; named in the report if the rank hangs."""
    chan = CHANNEL.get(None)
    if chan is not None:
        chan.post("progress", str(label))


def report(obj) -> None:
    """Send a partial result to the parent now. If the run later fails (a hang, a crash), the parent still
    has every report made before that: RunFailed.reports[rank] lists them in order."""
    chan = CHANNEL.get(None)
    if chan is not None:
        chan.post("report", to_plain(obj))


def init_method() -> str:
    """The init_method of the current run (usable by `fn` when run_ranks(init=False))."""
    return os.environ["MCCL_TEST_INIT_METHOD"]


def to_plain(obj):
    """Recursively replace torch tensors by numpy arrays so results pickle without shared memory."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)
        if t.is_sparse:
            t = t.to_dense()
        return t.numpy().copy()
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_plain(v) for v in obj)
    return obj


def run_rank(fn, chan: RankChannel, *, backend: str, init: bool, args: tuple) -> int:
    """A rank of run_ranks (the adapter `world.rank_main` calls): the group, fn, the result or the error."""
    import torch.distributed as dist

    CHANNEL.set(chan)
    try:
        if backend == "mccl":
            importlib.import_module("lightning_mccl")  # registers the backend
        if init:
            progress("init_process_group")
            dist.init_process_group(backend, init_method=init_method(), rank=chan.rank, world_size=chan.world,
                                    timeout=timedelta(seconds=chan.pg_timeout_s))
        progress("fn")
        result = fn(chan.rank, chan.world, *args)
        if init and dist.is_initialized():
            progress("destroy_process_group")
            dist.destroy_process_group()
        chan.post("ok", to_plain(result))
        return 0
    except BaseException:
        text = traceback.format_exc()
        if not chan.post("error", text):
            sys.stderr.write(f"[rank {chan.rank}] could not report its failure:\n{text}\n")
        return 1


class RunFailed(AssertionError):
    """run_ranks failed. Besides the message: what each rank got to (results, errors by rank), the partial
    reports each rank sent (see report()), each rank's last progress label, and the ranks that hung."""

    def __init__(self, message, *, results, errors, reports, last_progress, unfinished):
        super().__init__(message)
        self.results = results
        self.errors = errors
        self.reports = reports
        self.last_progress = last_progress
        self.unfinished = unfinished


def run_ranks(fn, world_size: int, *, backend: Optional[str] = None, timeout: float = 120.0, args: tuple = (),
              env: Optional[dict] = None, ranks=None, init: bool = True, pg_timeout: Optional[float] = None,
              failure_grace: float = FAILURE_GRACE_S) -> list:
    """Run `fn(rank, world_size, *args)` in `world_size` processes; return results by rank.

    backend: default backend_name(). timeout: the parent's deadline for the whole run, in seconds.
    env: extra environment variables for the children. ranks: start only these ranks (the others never
    arrive; used to test rendezvous timeouts); the result list then has None for ranks not started.
    init: False leaves init_process_group to `fn` (see init_method()). pg_timeout: the process group's
    timeout (default: a little under `timeout`, so that a stuck collective raises inside the rank first).
    failure_grace: how long the other ranks get to finish once one has failed (default FAILURE_GRACE_S).

    Raises RunFailed (an AssertionError) with every failing rank's traceback, the exit code of a rank that
    died without reporting, or the ranks that did not finish within `timeout` (after killing all of them).
    """
    backend = backend or backend_name()
    if pg_timeout is None:
        pg_timeout = max(5.0, min(timeout * 0.75, timeout - 15.0))
    port = free_port()
    init_url = f"tcp://127.0.0.1:{port}"
    module = sys.modules.get(getattr(fn, "__module__", ""))
    here = os.path.dirname(os.path.abspath(module.__file__)) if getattr(module, "__file__", None) else None
    child_env = {
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MCCL_TEST_INIT_METHOD": init_url,
        "MCCL_TEST_BACKEND": backend,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        # what a rank's own subprocesses need to import fn's module (and its neighbours) by name
        "PYTHONPATH": os.pathsep.join(([here] if here else [])
                                      + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        **{k: str(v) for k, v in (env or {}).items()},
    }
    with tempfile.TemporaryDirectory(prefix="mccl-test-stacks-") as stack_dir:
        world = RankWorld(run_rank, fn, world_size, pg_timeout_s=pg_timeout, env=child_env, ranks=ranks,
                          stack_dir=stack_dir, options=dict(backend=backend, init=init, args=tuple(args)))
        return _collect(world, fn, backend, timeout, failure_grace)


def _collect(world: RankWorld, fn, backend: str, timeout: float, failure_grace: float) -> list:
    start = time.monotonic()
    deadline = start + timeout
    ranks = world.ranks
    results: Dict[int, object] = {}
    errors: Dict[int, str] = {}
    reports: Dict[int, list] = {r: [] for r in ranks}
    last_progress: Dict[int, str] = {r: "starting" for r in ranks}
    first_failure_at = None
    try:
        while True:
            # A rank is finished once it reported and its process exited (and its pipe reached its end).
            pending = [r for r in ranks if world.procs[r].exitcode is None or world.conns[r] is not None]
            now = time.monotonic()
            limit = deadline if first_failure_at is None else min(deadline, first_failure_at + failure_grace)
            if not pending or now >= limit:
                break
            for r, kind, payload in world.poll(min(0.5, max(0.0, limit - now))):
                if kind == "progress":
                    last_progress[r] = payload
                elif kind == "report":
                    reports[r].append(payload)
                elif kind == "ok":
                    results[r] = payload
                    last_progress[r] = "reported its result"
                else:
                    errors[r] = payload
                    last_progress[r] = "reported an error"
                    first_failure_at = first_failure_at or time.monotonic()
            for r in ranks:
                gone = world.procs[r].exitcode is not None
                if gone and r not in results and r not in errors and world.conns[r] is None:
                    first_failure_at = first_failure_at or time.monotonic()
                if gone and world.conns[r] is not None and not world.conns[r].poll():
                    world.conns[r].close()  # exited without its pipe reaching its end: nothing more will come
                    world.conns[r] = None
    finally:
        unfinished = world.alive()
        stacks = world.dump_stacks(unfinished)
        world.kill()
        world.close()
    return _verdict(world, fn, backend, timeout, failure_grace, time.monotonic() - start, first_failure_at, deadline,
                    results, errors, reports, last_progress, unfinished, stacks)


def _verdict(world, fn, backend, timeout, failure_grace, elapsed, first_failure_at, deadline, results, errors,
             reports, last_progress, unfinished, stacks) -> list:
    problems: List[str] = []
    for r in world.ranks:
        if r in errors:
            problems.append(f"--- rank {r} raised:\n{errors[r].rstrip()}")
    for r in world.ranks:
        code = world.procs[r].exitcode
        if r in unfinished:
            state = "reported its result but did not exit" if r in results else f"last progress: {last_progress[r]!r}"
            problems.append(f"--- rank {r} did not finish ({state}); killed. Its Python stacks:\n{stacks.get(r, '(none)')}")
        elif r not in results and r not in errors:
            problems.append(
                f"--- rank {r} died without reporting a result (exit code {code}; last progress: {last_progress[r]!r})")
        elif r in results and code != 0:
            problems.append(f"--- rank {r} reported its result but then exited with code {code}")
    if problems:
        head = f"run_ranks({fn.__qualname__}, world_size={world.world}, backend={backend!r}) failed after {elapsed:.1f}s"
        if unfinished:
            if first_failure_at is not None and first_failure_at + failure_grace < deadline:
                why = f"the {failure_grace:.0f}s grace after another rank failed"
            else:
                why = f"the {timeout:.0f}s deadline"
            head += f"; ranks {unfinished} did not finish within {why}"
        raise RunFailed(head + "\n" + "\n".join(problems), results=results, errors=errors, reports=reports,
                        last_progress=last_progress, unfinished=unfinished)
    return [results.get(r) for r in range(world.world)]
