"""The harness itself: results come back by rank, and every way a rank can go wrong (an exception, a crash,
a hang) becomes an AssertionError that says which rank and why, within the deadline. No process group is
created here (init=False), so these tests do not depend on the backend."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from lightning_mccl.testing import RunFailed, progress, report, run_ranks


def echo_worker(rank, ws, base):
    import torch

    report(("partial", rank))
    return {"rank": rank, "ws": ws, "value": base + rank, "tensor": torch.arange(3) * rank}


def test_results_by_rank():
    res = run_ranks(echo_worker, 2, backend="gloo", init=False, args=(10,), timeout=60)
    assert [r["rank"] for r in res] == [0, 1]
    assert [r["value"] for r in res] == [10, 11]
    assert all(r["ws"] == 2 for r in res)
    assert res[1]["tensor"].tolist() == [0, 1, 2]  # tensors come back as numpy arrays


def misbehaving_worker(rank, ws, arrived_dir):
    progress(f"rank {rank} misbehaving")
    report(("before", rank))
    # Every rank has started and reported before any misbehaves, so that the short grace after the first
    # failure (FAILURE_GRACE below) only has to cover the last messages, not another interpreter's start.
    open(os.path.join(arrived_dir, str(rank)), "w").close()
    give_up = time.monotonic() + 60
    while len(os.listdir(arrived_dir)) < ws and time.monotonic() < give_up:
        time.sleep(0.05)
    if rank == 0:
        return "fine"
    if rank == 1:
        raise ValueError("boom from rank 1")
    if rank == 2:
        os._exit(3)
    if rank == 3:
        os.kill(os.getpid(), signal.SIGSEGV)
    progress("rank 4 sleeping forever")
    while True:
        time.sleep(1)


# The grace the other ranks get after the first failure (run_ranks' default is 15 s, for ranks that may be
# stuck in a collective); here rank 4 only has to send its last progress line within it.
FAILURE_GRACE = 3.0


def test_every_failure_is_reported_within_the_deadline(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as info:
        # 30 s: five interpreters importing torch on a loaded 2-core machine can take 10 s to start.
        run_ranks(misbehaving_worker, 5, backend="gloo", init=False, timeout=30, args=(str(tmp_path),),
                  failure_grace=FAILURE_GRACE)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert elapsed < 30 + 10, f"run_ranks took {elapsed:.1f}s with a 30 s deadline"
    assert f"did not finish within the {FAILURE_GRACE:.0f}s grace after another rank failed" in msg, msg
    assert re.search(r"rank 1 raised:.*ValueError: boom from rank 1", msg, re.S), msg
    assert "rank 2 died without reporting a result (exit code 3" in msg, msg
    assert "rank 3 died without reporting a result (exit code -11" in msg, msg
    assert re.search(r"rank 4 did not finish \(last progress: 'rank 4 sleeping forever'\); killed", msg), msg
    assert "misbehaving_worker" in msg and "in misbehaving_worker" in msg  # rank 4's Python stack
    assert "--- rank 0" not in msg, msg
    err = info.value
    assert err.unfinished == [4]
    assert err.results == {0: "fine"}
    assert all(err.reports[r] == [("before", r)] for r in range(5)), err.reports


def test_module_level_function_required():
    def local(rank, ws):
        return rank

    with pytest.raises(ValueError, match="module-level"):
        run_ranks(local, 1, backend="gloo", init=False)
