"""Smoke test of benchmarks/churn.py: every case with tiny settings (3 CPU members on loopback, a small MLP,
one epoch of 8 steps; the churn case a leave every 1.5 s, back 0.5 s later). Checks the harness (a row per case and
variant, the ledger column, the measured columns filled, the PNG), never the timings."""
from __future__ import annotations

import csv

import pytest

from bench_runner import explain, run_script

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)


def test_churn_writes_a_row_per_case_and_the_ledgers_hold(tmp_path):
    out = tmp_path / "out"
    proc = run_script("churn.py", "--members", 3, "--width", 64, "--depth", 1, "--num-samples", 96,
                      "--global-batch", 12, "--epochs", 1, "--steady-epochs", 1, "--churn-epochs", 16,
                      "--sample-s", 0.002, "--leave-every", 1.5, "--back-after", 0.5, "--warm-steps", 3,
                      "--timeout", 100, "--out", out,
                      timeout=170)
    assert proc.returncode == 0, explain(proc)
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["case"], r["variant"]) for r in rows] == [
        ("steady", "elastic"), ("steady", "plain DDP"), ("churn", "leave every 1.5 s, back 0.5 s"),
        ("join", "2 + 1 joiner"), ("mixed", "2 of 3 at 1/2 speed, pacing on"),
        ("mixed", "2 of 3 at 1/2 speed, pacing off")]
    assert all(r["ledger"] == "ok" for r in rows), rows
    assert all(float(r["samples_per_s"]) > 0 and float(r["step_time_median_s"]) > 0 for r in rows), rows
    steady, plain, churn, join, pace_on, pace_off = rows
    assert float(steady["value"]) > 0 and float(churn["value"]) > 0
    assert int(churn["leaves"]) >= 1 and float(churn["mean_members"]) <= 3
    assert float(join["heal_s"]) > 0 and int(join["state_bytes"]) > 0 and join["value"] == ""  # no link rate
    assert float(pace_on["own_rates_sum"]) > 0 and float(pace_on["value"]) > 0 and float(pace_off["value"]) > 0
    md = (out / "results.md").read_text()
    assert "- command: `" in md and "| ledger |" in md.replace("| ledger |", "| ledger |")
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ledger" in proc.stdout_text
