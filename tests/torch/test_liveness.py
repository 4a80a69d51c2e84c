"""A rank that stops without closing its connections (SIGSTOP here; a Mac that went to sleep, a pulled
cable) must be detected by heartbeats within MCCL_HEARTBEAT_TIMEOUT, also while no collective runs,
and long before the process group's timeout.

Rank 1 stops itself with SIGSTOP after a first all_reduce. Rank 0 stays idle for longer than the
heartbeat timeout, then calls all_reduce: the call must raise at once, with a message naming rank 1,
its address, and how long it was silent. Rank 0 then resumes rank 1 (SIGCONT) so both can leave.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest
import torch
import torch.distributed as dist

from lightning_mccl.testing import backend_name, progress, run_ranks

HEARTBEAT_TIMEOUT_S = 2.0
PG_TIMEOUT_S = 60.0


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:  # macOS: no /proc
        out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout
        return out.strip().startswith("T")


def stopped_peer_worker(rank, ws):
    store = dist.distributed_c10d._get_default_store()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    if t.tolist() != [3.0] * 4:
        raise AssertionError(f"warm-up all_reduce gave {t.tolist()}")
    if rank == 1:
        store.set("liveness/pid/1", str(os.getpid()))
        progress("stopped (SIGSTOP)")
        os.kill(os.getpid(), signal.SIGSTOP)  # until rank 0 sends SIGCONT
        return None
    pid = int(store.get("liveness/pid/1").decode())
    try:
        deadline = time.monotonic() + 10
        while not _is_stopped(pid):
            if time.monotonic() > deadline:
                raise AssertionError("rank 1 did not stop")
            time.sleep(0.01)
        progress("idle while rank 1 is stopped")
        time.sleep(HEARTBEAT_TIMEOUT_S + 1.5)  # no collective runs meanwhile
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))
        except Exception as e:  # noqa: BLE001 - the point of the test
            return ("raised", time.monotonic() - t0, type(e).__name__, str(e))
        return ("returned", time.monotonic() - t0, None, None)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_stopped_peer_is_detected_while_idle():
    if backend_name() == "gloo":
        pytest.skip("gloo has no heartbeats: it notices a stopped peer only at the collective's timeout")
    res = run_ranks(stopped_peer_worker, 2, timeout=60, pg_timeout=PG_TIMEOUT_S,
                    env={"MCCL_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S)})
    outcome, secs, etype, msg = res[0]
    assert outcome == "raised", f"all_reduce with a stopped peer returned after {secs:.1f}s"
    assert secs < 1.0, f"the failure was not detected while idle: all_reduce took {secs:.1f}s to raise: {msg}"
    assert etype in ("DistBackendError", "RuntimeError"), f"{etype}: {msg}"
    for pattern in (r"heartbeat", r"rank 1 \(127\.0\.0\.1:\d+\)", r"MCCL_HEARTBEAT_TIMEOUT=2\b", r"stopped"):
        assert re.search(pattern, msg), f"the message lacks {pattern!r}: {msg[:500]}"
    silent = float(re.search(r"heard nothing from .*? for ([0-9.]+) s", msg).group(1))
    assert HEARTBEAT_TIMEOUT_S <= silent <= HEARTBEAT_TIMEOUT_S + 1.5, f"detected after {silent} s of silence: {msg}"
