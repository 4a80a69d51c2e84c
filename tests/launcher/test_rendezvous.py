"""`lightning_mccl.rendezvous`: the ranks that have not arrived are named (with their hosts) while the
others wait, the timeout fails every waiting rank naming them, and Ctrl-C stops a waiting rank at once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_mccl.launcher import free_port
from lightning_mccl.rendezvous import REPORT_S, describe_ranks, launcher_hosts, report_interval

PROGRAM = str(Path(__file__).resolve().parent / "rendezvous_rank.py")
HARD_TIMEOUT_S = 60


def _start(port, rank, world, timeout_s, report_s=0.5, hosts="mac-a,mac-b,mac-c", rounds=1, hold_s=0.0):
    env = dict(os.environ, MCCL_HOSTS=hosts, LOCAL_WORLD_SIZE="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, PROGRAM, str(port), str(rank), str(world), str(timeout_s),
                             str(report_s), str(rounds), str(hold_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=_default_sigint)


def _default_sigint():
    # As a rank of `mccl launch` has it (rank_shim), also when pytest itself runs with SIGINT ignored (a
    # background job), which the rank would inherit.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _finish(proc, timeout=HARD_TIMEOUT_S):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"rank did not finish within {timeout} s\n{out}\n{err}")
    return proc.returncode, out, err


def _wait_for_line(proc, text, timeout=HARD_TIMEOUT_S):
    """Reads the child's stderr until a line contains `text`; returns the lines read."""
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"never printed {text!r}: {''.join(lines)}")


def test_a_missing_rank_is_named_while_the_others_wait_then_by_the_timeout():
    port = free_port()
    ranks = [_start(port, r, 3, timeout_s=6) for r in (0, 1)]  # rank 2 (mac-c) is never started
    t0 = time.monotonic()
    results = [_finish(p) for p in ranks]
    elapsed = time.monotonic() - t0
    for code, out, err in results:
        assert code == 3, out + err
        assert "RendezvousError: rank 2 (host mac-c) did not reach the rendezvous at 127.0.0.1" in out, out
        assert "within 6 s (the group timeout; MCCLStrategy(timeout=...)); 2 of 3 ranks arrived" in out, out
    reports = [line for line in results[0][2].splitlines()
               if "mccl rendezvous (rank 0): waiting for 1 of 3 ranks" in line and "rank 2 (host mac-c)" in line]
    assert len(reports) >= 3, results[0][2]  # kept reporting, every 0.5 s here
    assert "waiting for" not in results[1][2]  # rank 0 alone reports; the others wait quietly
    assert elapsed < 30, elapsed


def test_a_late_rank_is_reported_then_everyone_proceeds_with_one_store():
    port = free_port()
    first = _start(port, 0, 2, timeout_s=60, hosts="mac-a,mac-b")
    _wait_for_line(first, "waiting for 1 of 2 ranks")
    second = _start(port, 1, 2, timeout_s=60, hosts="mac-a,mac-b")
    for proc in (first, second):
        code, out, err = _finish(proc)
        assert code == 0 and "saw ['0', '10']" in out, out + err


def test_a_second_group_waits_for_rank_0s_new_store_while_the_first_one_is_still_open():
    # Each process makes two groups on one port (destroy_process_group, then a new fit); rank 0 keeps its first
    # store 2 s after the first round, so the others come to their second rendezvous at a store that is about to
    # close (a client of it sees it go away), and must wait for rank 0's next one.
    port = free_port()
    ranks = [_start(port, r, 3, timeout_s=60, rounds=2, hold_s=2.0) for r in range(3)]
    for proc in ranks:
        code, out, err = _finish(proc)
        assert code == 0 and out.count("saw ['0', '10', '20']") == 2, out + err
        assert "went away" not in out + err


@pytest.mark.parametrize("rank", [0, 1], ids=["rank0-waiting-for-peers", "rank1-waiting-for-rank0"])
def test_ctrl_c_stops_a_rank_waiting_at_the_rendezvous(rank):
    port = free_port()
    proc = _start(port, rank, 2, timeout_s=600, hosts="mac-a,mac-b")
    _wait_for_line(proc, "waiting for 1 of 2 ranks" if rank == 0 else "cannot reach rank 0 at 127.0.0.1")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code, out, err = _finish(proc, timeout=15)
    assert time.monotonic() - t0 < 8, err  # a connection attempt lasts CONNECT_ATTEMPT_S (1 s), then exit
    assert code != 0 and "KeyboardInterrupt" in err, err


def test_hosts_come_from_the_launcher_and_the_report_interval_is_checked():
    assert launcher_hosts(4, {"MCCL_HOSTS": "a,b", "LOCAL_WORLD_SIZE": "2"}) == ["a", "a", "b", "b"]
    assert launcher_hosts(3, {"MCCL_HOSTS": "a,b", "LOCAL_WORLD_SIZE": "2"}) is None  # not this launch
    assert launcher_hosts(2, {}) is None
    assert describe_ranks([2, 3], ["a", "a", "b", "b"]) == "rank 2 (host b), rank 3 (host b)"
    assert describe_ranks([2, 3], None) == "ranks 2, 3" and describe_ranks([1], None) == "rank 1"
    assert report_interval({}) == REPORT_S == 10.0 and report_interval({"MCCL_RENDEZVOUS_REPORT_S": "2.5"}) == 2.5
    with pytest.raises(ValueError, match="MCCL_RENDEZVOUS_REPORT_S='0' is not a positive number"):
        report_interval({"MCCL_RENDEZVOUS_REPORT_S": "0"})
