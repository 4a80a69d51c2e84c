"""Smoke test of benchmarks/ddp_vit.py: 2 ranks, a one-block ViT, 2 timed steps. Checks the harness (files,
rows for every series, replicas trained through mccl and Gloo agree), never the timings."""
from __future__ import annotations

import csv

from bench_runner import explain, run_script


def test_ddp_vit_writes_table_and_replicas_agree(tmp_path):
    out = tmp_path / "out"
    proc = run_script("ddp_vit.py", "--nproc", 2, "--model", "vit_tiny_patch16_224", "--depth", 1, "--img-size", 16,
                      "--patch-size", 8, "--batch", 2, "--steps", 2, "--warmup", 1, "--out", out, "--timeout", 100,
                      timeout=120)
    assert proc.returncode == 0, explain(proc)
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["world"], r["series"]) for r in rows] == [("2", "compute"), ("2", "mccl"), ("2", "gloo")]
    for r in rows:
        assert r["iters"] == "2" and float(r["time_median_s"]) > 0, r
        assert abs(float(r["samples_per_s"]) - 2 * 2 / float(r["time_median_s"])) < 1e-6, r
        assert int(r["params"]) > 0 and int(r["grad_bytes"]) == 4 * int(r["params"]), r
    gloo = rows[2]
    assert gloo["weights_vs"] == "mccl" and gloo["weights_match"] == "yes", gloo
    assert float(gloo["weights_max_diff"]) <= 1e-4
    assert rows[1]["time_vs_gloo"] != "" and gloo["time_vs_gloo"] == ""
    md = (out / "results.md").read_text()
    assert "- model: vit_tiny_patch16_224, img 16, patch 8, depth 1" in md and "| 2 | mccl |" in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
