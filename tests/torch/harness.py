"""Multi-process harness for the torch.distributed tests of the "mccl" backend.

`run_ranks(fn, world_size)` starts one process per rank, initialises the process group in each
(TCP rendezvous on a free localhost port), runs `fn(rank, world_size, *args)`, destroys the group and
hands back every rank's result. The parent owns the deadline: a rank that does not finish in time is
killed and the call raises AssertionError naming it (and what it was doing, see `progress`), so a bug in
the backend shows up as a test failure, never as a hung test run.

The backend is chosen by the environment variable MCCL_TEST_BACKEND (default "mccl"); "gloo" runs the
same tests against PyTorch's Gloo backend, which is how the tests themselves are validated.

Ranks are forks of a fork server that imported torch once (`_context`), which saves each rank the second or
two of importing it; everything else starts fresh in the rank, as in a spawned interpreter: the rank gets the
parent's environment at the call (the server's own is cleared) and imports lightning_mccl itself, so
variables read once per process still are.

Results travel through a Pipe, so they must be picklable; torch tensors are converted to numpy arrays
before they are sent (bfloat16 as float32, which is exact).
"""

from __future__ import annotations

import faulthandler
import importlib
import importlib.util
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

DEFAULT_BACKEND = "mccl"
# After one rank has failed, how long the others get to finish (they may be stuck in a collective with
# the failed rank) before they are killed and the failure is reported.
FAILURE_GRACE_S = 15.0
# Between SIGTERM and SIGKILL.
KILL_GRACE_S = 2.0
# What the fork server imports once for every rank: torch reads none of the MCCL_* variables, and the tests'
# torch variables (GLOO_SOCKET_IFNAME, OMP_NUM_THREADS) are read when a group or a thread pool starts.
# torch._dynamo is what DDP's constructor imports (2-3 s of CPU in each rank that makes a DDP model).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "numpy"]
_ctx = None


def _context():
    """The forkserver context of every run_ranks call, started on first use (with HERE on its sys.path)."""
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(PRELOAD)
    return _ctx


def backend_name() -> str:
    """The backend under test: $MCCL_TEST_BACKEND, default "mccl"."""
    return os.environ.get("MCCL_TEST_BACKEND", DEFAULT_BACKEND).strip() or DEFAULT_BACKEND


def is_gloo(backend: str | None = None) -> bool:
    return (backend or backend_name()) == "gloo"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the small race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------------------
# Child side

_progress_conn = None
_progress_rank = None


def progress(label: str) -> None:
    """Tell the parent what this rank is doing now; named in the report if the rank hangs."""
    if _progress_conn is not None:
        try:
            _progress_conn.send(("progress", str(label)))
        except Exception:  # the parent is gone: nothing to report to
            pass


def report(obj) -> None:
    """Send a partial result to the parent now. If the run later fails (a hang, a crash), the parent still
    has every report made before that: RunFailed.reports[rank] lists them in order."""
    if _progress_conn is not None:
        _progress_conn.send(("report", to_plain(obj)))


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


def _child_main(fn_ref, rank, world_size, backend, init_url, pg_timeout_s, init, args, conn, stack_path, environ,
                path):
    global _progress_conn, _progress_rank
    os.environ.clear()  # the fork server's environment and sys.path are the first call's: take this call's
    os.environ.update(environ)
    sys.path[:] = path
    _progress_conn = conn
    _progress_rank = rank
    # On SIGUSR1 (sent by the parent to a rank that missed the deadline) dump every thread's Python stack
    # to a file the parent puts into its report.
    stack_file = open(stack_path, "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "mccl":
            importlib.import_module("lightning_mccl")  # registers the backend
        module_name, qualname = fn_ref
        fn = importlib.import_module(module_name)
        for part in qualname.split("."):
            fn = getattr(fn, part)
        if init:
            progress("init_process_group")
            dist.init_process_group(
                backend,
                init_method=init_url,
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=pg_timeout_s),
            )
        progress("fn")
        result = fn(rank, world_size, *args)
        if init and dist.is_initialized():
            progress("destroy_process_group")
            dist.destroy_process_group()
        result = to_plain(result)
        conn.send(("ok", result))
    except BaseException:
        text = traceback.format_exc()
        try:
            conn.send(("error", text))
        except Exception:
            sys.stderr.write(f"[rank {rank}] could not report its failure:\n{text}\n")
        sys.stderr.flush()
        # Do not run interpreter teardown (process-group destructors may block on dead peers); the
        # failure itself has been reported above and the exit code says so too.
        os._exit(1)
    finally:
        try:
            conn.close()
        except Exception:
            pass


# ----------------------------------------------------------------------------------------------------------
# Parent side


def _kill(procs) -> None:
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except (ProcessLookupError, TypeError):
            pass
    deadline = time.monotonic() + KILL_GRACE_S
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass
    for p in alive:
        p.join(5.0)


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


def _dump_stacks(procs: dict, paths: dict) -> dict:
    """Ask hung ranks for their Python stacks (SIGUSR1 -> faulthandler) and read them back."""
    for p in procs.values():
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except (ProcessLookupError, TypeError):
            pass
    if procs:
        time.sleep(1.0)
    out = {}
    for r in procs:
        try:
            with open(paths[r]) as f:
                text = f.read().strip()
        except OSError:
            text = ""
        lines = text.splitlines()
        if len(lines) > 60:
            lines = lines[:60] + [f"... ({len(lines) - 60} more lines)"]
        out[r] = "\n".join("    " + line for line in lines) or "    (no stack was written)"
    return out


def run_ranks(
    fn,
    world_size: int,
    *,
    backend: str | None = None,
    timeout: float = 120.0,
    args: tuple = (),
    env: dict | None = None,
    ranks=None,
    init: bool = True,
    pg_timeout: float | None = None,
    failure_grace: float = FAILURE_GRACE_S,
) -> list:
    """Run `fn(rank, world_size, *args)` in `world_size` spawned processes; return results by rank.

    backend: default backend_name(). timeout: the parent's deadline for the whole run, in seconds.
    env: extra environment variables for the children. ranks: start only these ranks (the others never
    arrive; used to test rendezvous timeouts); the result list then has None for ranks not started.
    init: False leaves init_process_group to `fn` (see init_method()). pg_timeout: the process group's
    timeout (default: a little under `timeout`, so that a stuck collective raises inside the rank first).
    failure_grace: how long the other ranks get to finish once one has failed (default FAILURE_GRACE_S).

    Raises AssertionError with every failing rank's traceback, the exit code of a rank that died without
    reporting, or the ranks that did not finish within `timeout` (after killing all of them).
    """
    backend = backend or backend_name()
    if backend == "mccl" and importlib.util.find_spec("lightning_mccl") is None:
        raise AssertionError(
            "backend 'mccl' selected (MCCL_TEST_BACKEND) but the package lightning_mccl is not "
            "importable; build/install it, or set MCCL_TEST_BACKEND=gloo to validate the tests"
        )
    if getattr(fn, "__module__", "__main__") == "__main__" or "<locals>" in fn.__qualname__:
        raise ValueError("run_ranks needs a module-level function (it is imported by name in the children)")
    if ranks is None:
        ranks = list(range(world_size))
    if pg_timeout is None:
        pg_timeout = max(5.0, min(timeout * 0.75, timeout - 15.0))
    port = free_port()
    init_url = f"tcp://127.0.0.1:{port}"

    child_env = {
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MCCL_TEST_INIT_METHOD": init_url,
        "MCCL_TEST_BACKEND": backend,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONPATH": os.pathsep.join([HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
    }
    child_env.update({k: str(v) for k, v in (env or {}).items()})

    ctx = _context()
    fn_ref = (fn.__module__, fn.__qualname__)
    procs: dict[int, mp.Process] = {}
    conns: dict[int, mpc.Connection] = {}
    saved = {k: os.environ.get(k) for k in child_env}
    stack_dir = tempfile.TemporaryDirectory(prefix="mccl-test-stacks-")
    stack_paths: dict[int, str] = {}
    try:
        os.environ.update(child_env)  # what each rank's environment is set to (_child_main)
        for rank in ranks:
            recv_conn, send_conn = ctx.Pipe(duplex=False)
            stack_paths[rank] = os.path.join(stack_dir.name, f"rank{rank}.stack")
            p = ctx.Process(
                target=_child_main,
                args=(fn_ref, rank, world_size, backend, init_url, pg_timeout, init, args, send_conn, stack_paths[rank],
                      dict(os.environ), list(sys.path)),
                name=f"mccl-test-rank{rank}",
                daemon=True,
            )
            p.start()
            send_conn.close()
            procs[rank] = p
            conns[rank] = recv_conn
    except BaseException:
        _kill(list(procs.values()))
        stack_dir.cleanup()
        raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    start = time.monotonic()
    deadline = start + timeout
    results: dict[int, object] = {}
    errors: dict[int, str] = {}
    reports: dict[int, list] = {r: [] for r in ranks}
    last_progress: dict[int, str] = {r: "starting" for r in ranks}
    open_conns = dict(conns)
    first_failure_at = None

    try:
        while True:
            # A rank is finished once it reported and its process exited (or its pipe closed and it exited).
            pending = [r for r in ranks if procs[r].exitcode is None or r in open_conns]
            if not pending:
                break
            now = time.monotonic()
            limit = deadline
            if first_failure_at is not None:
                limit = min(limit, first_failure_at + failure_grace)
            if now >= limit:
                break
            waitables = list(open_conns.values()) + [procs[r].sentinel for r in pending if procs[r].exitcode is None]
            ready = mpc.wait(waitables, timeout=min(0.5, max(0.0, limit - now)))
            for r, c in list(open_conns.items()):
                if c not in ready:
                    continue
                try:
                    while c.poll():
                        kind, payload = c.recv()
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
                            if first_failure_at is None:
                                first_failure_at = time.monotonic()
                except (EOFError, OSError):
                    del open_conns[r]
                    c.close()
            for r in ranks:
                p = procs[r]
                if p.exitcode is not None and r not in results and r not in errors and r not in open_conns:
                    if first_failure_at is None:
                        first_failure_at = time.monotonic()
            # a process that exited without closing the pipe cleanly: drain and close it
            for r in list(open_conns):
                if procs[r].exitcode is not None and not open_conns[r].poll():
                    open_conns[r].close()
                    del open_conns[r]
    finally:
        unfinished = [r for r in ranks if procs[r].exitcode is None]
        stacks = _dump_stacks({r: procs[r] for r in unfinished}, stack_paths)
        _kill(list(procs.values()))
        for c in open_conns.values():
            c.close()
        stack_dir.cleanup()

    elapsed = time.monotonic() - start
    problems = []
    for r in ranks:
        if r in errors:
            problems.append(f"--- rank {r} raised:\n{errors[r].rstrip()}")
    for r in ranks:
        code = procs[r].exitcode
        if r in unfinished:
            state = "reported its result but did not exit" if r in results else f"last progress: {last_progress[r]!r}"
            problems.append(f"--- rank {r} did not finish ({state}); killed. Its Python stacks:\n{stacks.get(r, '(none)')}")
        elif r not in results and r not in errors:
            problems.append(
                f"--- rank {r} died without reporting a result (exit code {code}; last progress: {last_progress[r]!r})"
            )
        elif r in results and code != 0:
            problems.append(f"--- rank {r} reported its result but then exited with code {code}")
    if problems:
        head = f"run_ranks({fn.__qualname__}, world_size={world_size}, backend={backend!r}) failed after {elapsed:.1f}s"
        if unfinished:
            if first_failure_at is not None and first_failure_at + failure_grace < deadline:
                why = f"the {failure_grace:.0f}s grace after another rank failed"
            else:
                why = f"the {timeout:.0f}s deadline"
            head += f"; ranks {unfinished} did not finish within {why}"
        raise RunFailed(head + "\n" + "\n".join(problems), results=results, errors=errors, reports=reports,
                        last_progress=last_progress, unfinished=unfinished)
    return [results.get(r) for r in range(world_size)]
