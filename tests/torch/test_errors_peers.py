"""A peer that never arrives at rendezvous, or leaves, makes the others raise a clear Python exception
within timeout + 10 s, never a hang or a crash.

With MCCL_TEST_BACKEND=gloo the same tests run where Gloo supports them.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from error_checks import PG_TIMEOUT_S
from lightning_mccl.testing import backend_name, init_method, progress, run_ranks


RENDEZVOUS_TIMEOUT_S = 2.0  # only rank 0 is started: nothing but the timeout itself takes time


def lonely_worker(rank, ws, own_store):
    """Only this rank was started. init_process_group or the first collective must raise, not hang."""
    t0 = time.monotonic()
    timeout = timedelta(seconds=RENDEZVOUS_TIMEOUT_S)
    backend = backend_name()
    try:
        if own_store:
            # a store that does not wait for the other rank: the backend's own connection setup must time out
            port = int(init_method().rsplit(":", 1)[1])
            store = dist.TCPStore("127.0.0.1", port, ws, is_master=True, timeout=timeout, wait_for_workers=False)
            dist.init_process_group(backend, store=store, rank=rank, world_size=ws, timeout=timeout)
        else:
            dist.init_process_group(backend, init_method=init_method(), rank=rank, world_size=ws, timeout=timeout)
        progress("first collective")
        dist.all_reduce(torch.ones(4))
    except Exception as e:  # noqa: BLE001 - the point of the test
        return ("raised", time.monotonic() - t0, type(e).__name__, str(e))
    return ("returned", time.monotonic() - t0, None, None)


@pytest.mark.parametrize("own_store", [False, True], ids=["tcp_init_method", "store_without_worker_wait"])
def test_peer_never_arrives(own_store):
    res = run_ranks(lonely_worker, 2, ranks=[0], init=False, args=(own_store,), timeout=RENDEZVOUS_TIMEOUT_S + 40)
    outcome, secs, etype, msg = res[0]
    assert outcome == "raised", f"rank 0 of 2 (rank 1 never started) returned normally after {secs:.1f}s"
    assert secs <= RENDEZVOUS_TIMEOUT_S + 10, f"rank 0 raised only after {secs:.1f}s (timeout {RENDEZVOUS_TIMEOUT_S}s): {msg}"
    assert re.search(r"time|timed out|deadline", msg, re.I), f"the error does not say it timed out: {etype}: {msg[:500]}"


def leaving_worker(rank, ws):
    """Rank 1 leaves at once (destroys its group and exits); rank 0's next collective must raise."""
    if rank == 1:
        return None
    time.sleep(1.0)
    t0 = time.monotonic()
    try:
        t = torch.ones(1000)
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001
        return ("raised", time.monotonic() - t0, type(e).__name__, str(e))
    return ("returned", time.monotonic() - t0, t[:3].tolist(), None)


def test_peer_leaves():
    pg_timeout = PG_TIMEOUT_S
    res = run_ranks(leaving_worker, 2, timeout=pg_timeout + 40, pg_timeout=pg_timeout)
    outcome, secs, etype, msg = res[0]
    assert outcome == "raised", f"all_reduce with a peer that left returned after {secs:.1f}s: {etype}"
    assert secs <= pg_timeout + 10, f"raised only after {secs:.1f}s: {msg[:300]}"
    assert re.search(r"clos|connect|peer|rank\s*1|reset|broken|abort|time|shut", msg, re.I), \
        f"the error does not name the cause: {etype}: {msg[:500]}"
