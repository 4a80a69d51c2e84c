"""Smoke runs of the fault-injection harness (benchmarks/faults.py): a few trials of each kind, asserting the
harness's own verdicts and the facts behind them. The full acceptance run is `python benchmarks/faults.py`."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from reliability_env import BENCHMARKS, bounded
from reliability.fault_trials import fault_trial, mismatch_trial
from reliability.garbage import BASIC_KINDS
from reliability.garbage_trials import garbage_trial, reference_digest

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)

SMALL = 1024          # float32 elements: 4 KiB
LARGE = 4 << 20       # 16 MiB


def _explain(rec) -> str:
    rec = dict(rec)
    rec.pop("log", None)
    return json.dumps(rec, indent=1, default=str)[:4000]


@pytest.mark.parametrize("world, op, n, victim", [(3, "allreduce", LARGE, 1), (2, "allgather", SMALL, 0)])
def test_a_killed_rank_fails_every_survivor_at_once_naming_it(world, op, n, victim):
    rec = bounded(fault_trial, 60, world=world, op=op, n=n, fault="kill", victim=victim, delay_s=0.2,
                  pg_timeout_s=10)
    assert rec["ok"], _explain(rec)
    assert set(rec["survivors"]) == set(range(world)) - {victim} and not rec["hung"]
    for p in rec["survivors"].values():
        assert p["type"] == "DistBackendError" and p["latency_s"] < 3.0, _explain(rec)  # at once, not by timeout
        assert re.search(rf"\brank {victim}\b", p["message"]) and rec["victim_addr"] in p["message"], p["message"]
        assert p["later_call"] == "raised" and p["destroy"] == "ok"


def test_a_stopped_rank_is_named_by_the_heartbeat_before_the_group_timeout():
    # the trial sets MCCL_HEARTBEAT_TIMEOUT to 0.6 x the group timeout: 1.8 s here
    rec = bounded(fault_trial, 60, world=2, op="broadcast", n=SMALL, fault="stop", victim=1, delay_s=0.1,
                  pg_timeout_s=3)
    assert rec["ok"], _explain(rec)
    (p,) = rec["survivors"].values()
    assert 1.8 <= p["latency_s"] < 3.0, _explain(rec)
    assert "MCCL heartbeat timeout" in p["message"] and rec["victim_addr"] in p["message"], p["message"]


@pytest.mark.parametrize("kind", ["count", "collective", "broadcast_count"])
def test_a_mismatched_call_raises_on_every_rank(kind):
    rec = bounded(mismatch_trial, 60, world=3, kind=kind, victim=1, n=SMALL, pg_timeout_s=5)
    assert rec["ok"] and rec["detected"] and rec["silent_wrong"] == 0, _explain(rec)
    first = [p for p in rec["ranks"].values() if p["outcome"] == "raised"]
    assert first and all(p["says_mismatch"] for p in first), _explain(rec)


def test_garbage_connections_are_closed_logged_and_change_nothing():
    ref = bounded(reference_digest, 60, 3, 10)
    rec = bounded(garbage_trial, 90, world=3, rendezvous_connections=100, training_connections=100,
                  kinds=BASIC_KINDS, seed=7, pg_timeout_s=10, reference=ref)
    assert rec["ok"], _explain(rec)
    rdv, train = rec["phases"]["rendezvous"], rec["phases"]["training"]
    assert rdv["total"] == 100 and train["total"] == 100 and rec["accepted"] == 0
    # during rendezvous every connection reached a listener, which closed it and logged it (the first ones
    # by address, the rest as a count)
    assert rdv["reached_a_listener"] == 100, _explain(rec)
    assert rdv["logged_by_ranks"] >= 1 and rdv["logged_by_ranks"] + rdv["counted_by_ranks"] == 100, _explain(rec)
    assert rec["digest"] == ref and not rec["rank_errors"] and not rec["crashed"]


def test_the_command_line_runs_a_small_mix_and_writes_json(tmp_path):
    out = tmp_path / "faults.json"
    cmd = [sys.executable, f"{BENCHMARKS}/faults.py", "--kill-trials", "1", "--stop-trials", "0",
           "--mismatch-trials", "0", "--garbage-connections", "20", "--garbage-per-trial", "20",
           "--impersonation-trials", "0", "--stall-trials", "0", "--max-world", "2", "--large-bytes", "64K",
           "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KILL trials" in r.stdout and "GARBAGE connections" in r.stdout
    data = json.loads(out.read_text())
    assert data["summary"]["kill"]["passed"] == 1 and data["summary"]["garbage"]["connections"] == 20
    assert data["ok"] == {"kill": True, "stop": True, "mismatch": True, "garbage": True, "impersonation": True,
                          "stall": True}
