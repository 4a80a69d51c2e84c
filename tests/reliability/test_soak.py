"""A tiny soak (benchmarks/soak.py): mixed collectives and init/destroy cycles, resources sampled per rank;
and the growth verdict itself on made-up samples."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from reliability_env import BENCHMARKS
from reliability.growth import verdict

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)


def test_growth_verdict_tells_a_leak_from_a_warm_up():
    warm_then_flat = [{"rss_kb": 1000 + min(i, 10) * 500, "fds": 10 + (i < 5), "threads": 3} for i in range(100)]
    v = verdict(warm_then_flat, {"rss_kb": 1024})
    assert v["flat"] and v["rss_kb"]["growth"] == 0 and v["fds"]["growth"] == 0
    leaking = [{"rss_kb": 1000 + 64 * i, "fds": 10 + i // 50, "threads": 3} for i in range(100)]
    v = verdict(leaking, {"rss_kb": 1024})
    assert not v["flat"] and not v["rss_kb"]["flat"] and not v["fds"]["flat"] and v["threads"]["flat"]
    assert v["rss_kb"]["growth"] == 64 * 60  # medians of the first and last 20 samples after the warm-up


def test_a_tiny_soak_is_flat_and_right(tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, f"{BENCHMARKS}/soak.py", "--nproc", "3", "--collectives", "200", "--cycles", "20",
           "--max-bytes", str(1 << 20), "--samples", "20", "--out", str(out), "--deadline", "90"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    result = json.loads(out.read_text())
    assert not result["problems"], r.stdout + r.stderr
    for rank in ("0", "1", "2"):
        v = result["verdicts"][rank]
        assert set(v) == {"mixed", "cycles"} and len(result["samples"][rank]["cycles"]) == 20
        # fds: the same count after every cycle (each communicator's sockets closed by destroy)
        assert v["cycles"]["fds"]["growth"] == 0 and v["cycles"]["fds"]["max"] == v["cycles"]["fds"]["last"]
        assert v["mixed"]["fds"]["growth"] == 0
    assert "init/destroy cycles on 3 ranks" in r.stdout
