"""Inside one benchmark rank: the process groups, and interleaved timing.

Every rank joins a Gloo control group (the default group: results and iteration counts travel there, never
through a backend under test), plus one group per series. Groups of different backends live side by side
in the same processes, so mccl and Gloo run on the same ranks, cores and links in the same run.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
# Before any group exists (init_groups is here): torch.distributed.nn binds group.WORLD into its functions' defaults
# when first imported, and so holds the default group for good if the group exists by then (timm imports it, through
# torch._dynamo, when a rank builds its model). The Gloo group would outlive destroy_process_group() with its worker
# threads, into interpreter teardown, where a thread that frees a finished collective whose tensors Python has
# dropped must take the GIL and is ended inside that destructor: "terminate called without an active exception"
# (pytorch/pytorch#190489). Imported first, it binds None.
import torch.distributed.nn  # noqa: F401

from .series import Series


def init_groups(series: Sequence[Series], timeout_s: float) -> Dict[str, object]:
    """env:// rendezvous (the launcher's MASTER_ADDR, RANK, ...); returns {series label: process group}."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    if any(s.backend == "mccl" for s in series):
        import lightning_mccl  # noqa: F401  (registers the backend)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return {s.label: dist.new_group(backend=s.backend) for s in series}


def say(message: str) -> None:
    """Progress from rank 0 only, on stderr (the launcher prefixes it with the host and rank)."""
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    if rank == 0:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def dist_max_reduce(t: torch.Tensor) -> None:
    """In place: the elementwise MAX over all ranks, through the default (control) group."""
    dist.all_reduce(t, op=dist.ReduceOp.MAX)


def dist_min_reduce(t: torch.Tensor) -> None:
    """In place: the elementwise MIN over all ranks, through the default (control) group."""
    dist.all_reduce(t, op=dist.ReduceOp.MIN)


def dist_sum_over_hosts(t: torch.Tensor) -> None:
    """In place: the sum over hosts (network namespaces), through the default (control) group: of the ranks
    that share a host (tcp_counters.host_id), only the first one's `t` counts."""
    from . import tcp_counters

    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, tcp_counters.host_id())
    if hosts.index(hosts[dist.get_rank()]) != dist.get_rank():
        t.zero_()
    dist.all_reduce(t)


# A timing covers back-to-back calls for at least this long (nccl-tests style), so that small collectives
# are timed as a stream, not as one call racing the barrier's stragglers.
BATCH_TARGET_S = 0.02
MAX_BATCH = 1000


def interleaved_times(runs: Sequence[Tuple[Callable[[], None], Callable[[], None]]], *, warmup: int, iters: int,
                      min_iters: int, budget_s: float, max_reduce: Callable = dist_max_reduce,
                      counters: Optional[Callable[[], Sequence[int]]] = None,
                      counted: Optional[List[List[float]]] = None) -> List[List[float]]:
    """Times every run (fn, barrier) repetition by repetition, the runs taking turns within each repetition
    (rotating who goes first), so that a change in machine load hits all of them alike.

    Each timing is barrier(), then fn() `batch` times back to back, divided by `batch`: one call for large
    messages, as many as fill BATCH_TARGET_S for small ones (from the fastest warm-up call, per run). Small
    messages first run a quarter batch untimed (then the barrier again): a run that follows another
    backend's turn was measured up to 3x slower at 4 KiB without it (the first calls after the switch pay
    for it), which made the series placed after Gloo look slower than the same settings elsewhere. A
    repetition's time is the slowest rank's. The number of repetitions is `iters`, cut down to fit
    `budget_s` but never below `min_iters`; every rank agrees on the counts through `max_reduce`.
    Returns times[k] for run k: seconds per call. With `counters` (e.g. tcp_counters.read), counted[k] gets
    what they rose by over run k's timed batches (read outside the timing), this rank's own.
    """
    est = torch.full((len(runs),), float("inf"), dtype=torch.float64)
    for k, (fn, barrier) in enumerate(runs):
        for _ in range(max(1, warmup)):
            barrier()
            t0 = time.perf_counter()
            fn()
            est[k] = min(float(est[k]), time.perf_counter() - t0)
    max_reduce(est)  # the slowest rank's fastest call
    batch = [max(1, min(MAX_BATCH, int(BATCH_TARGET_S / max(float(e), 1e-9)))) for e in est]
    per_rep = sum(float(e) * b for e, b in zip(est, batch))
    n = max(min_iters, min(iters, int(budget_s / max(per_rep, 1e-9))))
    times = torch.zeros(n, len(runs), dtype=torch.float64)
    if counted is not None:
        counted[:] = [[0.0] * len(counters()) for _ in runs]
    for i in range(n):
        for j in range(len(runs)):
            k = (i + j) % len(runs)
            fn, barrier = runs[k]
            if batch[k] > 1:
                barrier()
                for _ in range(max(1, batch[k] // 4)):
                    fn()
            before = counters() if counted is not None else ()
            barrier()
            t0 = time.perf_counter()
            for _ in range(batch[k]):
                fn()
            times[i, k] = (time.perf_counter() - t0) / batch[k]
            if counted is not None:
                counted[k] = [c + b - a for c, a, b in zip(counted[k], before, counters())]
    max_reduce(times)
    return [times[:, k].tolist() for k in range(len(runs))]


def summarize(times: Sequence[float]) -> Dict[str, float]:
    return {"iters": len(times), "time_median_s": statistics.median(times), "time_min_s": min(times),
            "time_max_s": max(times)}
