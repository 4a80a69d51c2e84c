"""Staging of CUDA tensors never stalls the caller (csrc/torch/staging.hpp); skipped without a GPU.

Each rank queues a long kernel (torch.cuda._sleep, calibrated to SLEEP_S) on the stream it issues from,
then a kernel that produces the tensor, then the collective. The collective call must return while
the sleep is still running: `done.query()` (an event recorded after the sleep) is False right after
the call, and the call took less than a quarter of the sleep. A backend that copies to the host on
the caller's thread waits for the sleep and fails both. Then the result is checked against a float64
reference through a kernel queued on the caller's stream after wait() (it must see the copy back),
on the default stream and on a side stream, with several collectives in flight at once.
"""
from __future__ import annotations

import time

import pytest
import torch

from lightning_mccl.testing import run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SLEEP_S = 1.5
SIZES = (1, 1000, 70_000, 1_000_003)


def _values(rank, count):
    g = torch.Generator().manual_seed(500 + rank)
    return torch.randn(count, generator=g, dtype=torch.float64)


def cycles_per_s(dev):
    torch.cuda._sleep(1000)  # warm up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1000.0)


def _round(rank, base, sleep_cycles):
    """Sleep, produce, issue: returns (whether the sleep was still pending after issuing, issue time, results)."""
    import torch.distributed as dist

    done = torch.cuda.Event()
    dist.barrier()
    torch.cuda._sleep(sleep_cycles)
    done.record()
    tensors = [b * 3.0 for b in base]  # kernels queued after the sleep
    copies = [t.clone() for t in tensors[:2]]
    t0 = time.perf_counter()
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    futs = [dist.all_reduce(c, async_op=True).get_future() for c in copies]
    issue_s = time.perf_counter() - t0
    pending = not done.query()
    for w in works:
        w.wait()
    checks = [t * 1.0 for t in tensors]  # kernels on the caller's stream after wait()
    values = [f.wait()[0] * 1.0 for f in futs]
    return pending, issue_s, [c.double().cpu() for c in checks + values]


def no_stall(rank, world, use_side_stream):
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    sleep_cycles = int(SLEEP_S * cycles_per_s(dev))
    base = [_values(rank, n).to(dev, torch.float32) for n in SIZES]
    stream = torch.cuda.Stream(device=dev) if use_side_stream else torch.cuda.current_stream(dev)
    with torch.cuda.stream(stream):
        _round(rank, base, 1000)  # warm: staging streams and pinned buffers exist from now on
        pending, issue_s, got = _round(rank, base, sleep_cycles)
    refs = [3.0 * sum(_values(r, n) for r in range(world)) for n in SIZES]
    refs += refs[:2]
    correct = [bool(torch.allclose(g, ref, rtol=1e-5, atol=1e-4)) for g, ref in zip(got, refs)]
    return {"pending_after_issue": pending, "issue_s": issue_s, "correct": correct}


@pytest.mark.parametrize("use_side_stream", [False, True], ids=["current_stream", "side_stream"])
def test_collective_returns_while_a_long_kernel_is_pending(use_side_stream):
    results = run_ranks(no_stall, 2, args=(use_side_stream,), timeout=240)
    for rank, res in enumerate(results):
        assert res["pending_after_issue"], f"rank {rank}: the call waited for the caller's kernel ({res})"
        assert res["issue_s"] < SLEEP_S / 4, f"rank {rank}: issuing took {res['issue_s']:.3f} s ({res})"
        assert all(res["correct"]), f"rank {rank}: wrong results {res['correct']}"
