"""Ranks that disagree (sizes, collective, dtype) must all raise within the process group's timeout, never
hang; the mccl engine names the mismatch ("MCCL collective mismatch: rank 0 ... allreduce ... rank 1 ...").

With MCCL_TEST_BACKEND=gloo the same tests run where Gloo supports them; Gloo aborts the process on
mismatched sizes/dtypes, so those cases are skipped for gloo only."""

from __future__ import annotations

import re
import time
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from error_checks import ERROR_TYPES, PG_TIMEOUT_S
from lightning_mccl.testing import backend_name, run_ranks


def mismatch_worker(rank, ws, scenario):
    """Runs one mismatched call; returns (outcome, seconds, exception type, message)."""
    warnings.filterwarnings("ignore")
    t0 = time.monotonic()
    try:
        if scenario == "sizes":
            dist.all_reduce(torch.ones(10 if rank == 0 else 12))
        elif scenario == "collectives":
            if rank == 0:
                dist.all_reduce(torch.ones(10))
            else:
                dist.broadcast(torch.ones(10), src=0)
        elif scenario == "dtypes":
            dist.all_reduce(torch.ones(10, dtype=torch.float32 if rank == 0 else torch.float64))
        else:
            raise ValueError(scenario)
    except Exception as e:  # noqa: BLE001 - the point of the test
        outcome = ("raised", time.monotonic() - t0, type(e).__name__, str(e), isinstance(e, ERROR_TYPES))
    else:
        outcome = ("returned", time.monotonic() - t0, None, None, None)
    # Stay alive until every rank is out of its call: a rank that exits early would close its connections
    # and its peers would only ever see "connection closed", not the mismatch itself.
    store = dist.distributed_c10d._get_default_store()
    wait = timedelta(seconds=PG_TIMEOUT_S + 15)
    store.set(f"mismatch_test/{scenario}/out/{rank}", "1")
    store.wait([f"mismatch_test/{scenario}/out/{r}" for r in range(ws)], wait)
    # rank 0 hosts the store: it leaves last, so nobody's wait above loses its server
    store.set(f"mismatch_test/{scenario}/left/{rank}", "1")
    if rank == 0:
        store.wait([f"mismatch_test/{scenario}/left/{r}" for r in range(ws)], wait)
    return outcome


def _check_mismatch(results, detector_patterns, every=(r"mismatch|connection|closed|abort|lost", r"rank\s*\d")):
    """Every rank raised in time with a message naming a cause and a peer (`every`), and at least one rank
    (the one that detected it) describes the mismatch completely: it matches all `detector_patterns`."""
    problems = []
    for r, (outcome, secs, etype, msg, ok_type) in enumerate(results):
        if outcome != "raised":
            problems.append(f"rank {r} returned normally after {secs:.1f}s instead of raising")
            continue
        if secs > PG_TIMEOUT_S + 10:
            problems.append(f"rank {r} raised only after {secs:.1f}s (timeout {PG_TIMEOUT_S:.0f}s)")
        if not ok_type:
            problems.append(f"rank {r} raised {etype}, not a RuntimeError/ValueError/TypeError: {msg[:300]}")
        missing = [p for p in every if not re.search(p, msg, re.I)]
        if missing:
            problems.append(f"rank {r}'s message lacks {missing}: {etype}: {msg[:500]}")
    if detector_patterns and not any(
        res[3] and all(re.search(p, res[3], re.I) for p in detector_patterns) for res in results
    ):
        problems.append(f"no rank's message describes the mismatch completely ({detector_patterns})")
    messages = "\n".join(f"  rank {r} ({res[1]:.2f}s): {res[2]}: {(res[3] or '')[:400]}" for r, res in enumerate(results))
    print("messages:\n" + messages)
    if problems:
        pytest.fail("\n".join(problems) + "\nmessages:\n" + messages, pytrace=False)


def test_mismatched_sizes():
    if backend_name() == "gloo":
        pytest.skip("gloo aborts the process (SIGABRT, 'Received data size doesn't match expected size') on mismatched sizes")
    res = run_ranks(mismatch_worker, 2, args=("sizes",), timeout=PG_TIMEOUT_S + 40, pg_timeout=PG_TIMEOUT_S)
    # element counts 10 and 12 (or 40 and 48 bytes)
    _check_mismatch(res, [r"mismatch", r"all_?reduce", r"\b(10|40)\b", r"\b(12|48)\b", r"rank\s*0", r"rank\s*1"])


def test_mismatched_collectives():
    gloo = backend_name() == "gloo"
    pg_timeout = 5.0 if gloo else PG_TIMEOUT_S  # gloo can only time out: keep that short
    res = run_ranks(mismatch_worker, 2, args=("collectives",), timeout=pg_timeout + 40, pg_timeout=pg_timeout)
    if gloo:
        # Gloo does not detect the mismatch; both ranks must still raise (a timeout), never hang
        _check_mismatch(res, [], every=[r"time"])
        return
    _check_mismatch(res, [r"mismatch", r"all_?reduce", r"broadcast", r"rank\s*0", r"rank\s*1"])


def test_mismatched_dtypes():
    if backend_name() == "gloo":
        pytest.skip("gloo aborts the process (SIGABRT) on mismatched dtypes")
    res = run_ranks(mismatch_worker, 2, args=("dtypes",), timeout=PG_TIMEOUT_S + 40, pg_timeout=PG_TIMEOUT_S)
    _check_mismatch(res, [r"mismatch", r"all_?reduce", r"float32|\bfloat\b", r"float64|double", r"rank\s*0", r"rank\s*1"])
