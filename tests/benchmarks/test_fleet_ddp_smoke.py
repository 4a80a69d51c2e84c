"""Smoke test of benchmarks/fleet_ddp.py: 2 CPU ranks on loopback, a one-block timm ViT in 8x8 patches, 2 timed
steps, the exact series, a torch comm hook and the engine's bf16 wire compression (a launch of its own). Checks
the harness (files, a row per series, efficiency against the compute series, weights against the reference
within the tolerances), never the timings. The series parsing and launch grouping are checked in one process."""
from __future__ import annotations

import csv

import pytest

from bench_runner import explain, run_script
from sweep import ddp_series

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)


def test_fleet_ddp_writes_table_and_weights_agree(tmp_path):
    out = tmp_path / "out"
    series = "compute,mccl,gloo,mccl+bf16_hook,mccl-bf16"
    proc = run_script("fleet_ddp.py", "--nproc", 2, "--device", "cpu", "--model", "vit_tiny_patch16_224",
                      "--img-size", 32, "--patch-size", 8, "--depth", 1, "--num-classes", 10, "--batch", 2,
                      "--steps", 2, "--warmup", 1,
                      "--series", series, "--out", out, "--timeout", 100,
                      timeout=150)
    assert proc.returncode == 0, explain(proc)
    with open(out / "results.csv", newline="") as f:
        rows = {r["series"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["compute", "mccl", "gloo", "mccl+bf16_hook", "mccl-bf16"]
    for r in rows.values():
        assert r["world"] == "2" and r["batch_per_rank"] == "2" and r["iters"] == "2", r
        assert abs(float(r["samples_per_s"]) - 4 / float(r["time_median_s"])) < 1e-6, r
        eff = float(r["efficiency"])
        assert abs(eff - float(r["compute_median_s"]) / float(r["time_median_s"])) < 1e-9, r
        assert int(r["grad_bytes"]) == 4 * int(r["params"]) > 0
    assert rows["mccl"]["weights_match"] == "" and rows["mccl-bf16"]["wire_dtype"] == "bf16"
    for name, tol in (("gloo", 1e-3), ("mccl+bf16_hook", 5e-2), ("mccl-bf16", 5e-2)):
        r = rows[name]
        assert r["weights_vs"] == "mccl" and r["weights_match"] == "yes", r
        assert 0 <= float(r["weights_rel_diff"]) <= tol and float(r["weights_tol"]) == tol, r
    # 16-bit gradients on the wire differ from the exact run, but by far less than the tolerance's scale
    assert 0 < float(rows["mccl+bf16_hook"]["weights_rel_diff"])
    assert rows["gloo"]["vs_gloo"] == "" and float(rows["mccl"]["vs_gloo"]) > 0
    # the mccl series' steps split by the engine's timeline: parts that add up to the step, the payload on the
    # wire halved by bf16 compression; a row per timed step of every series in timeline_steps.csv, with the
    # machine's per-CPU load over the step
    parts = ("before_first", "held", "staging", "peers", "engine", "starved", "after_last")
    for name in ("mccl", "mccl+bf16_hook", "mccl-bf16"):
        r = rows[name]
        assert float(r["tl_collectives"]) >= 1 and float(r["tl_engine"]) > 0, r
    assert "tl_engine" not in rows["gloo"] or rows["gloo"]["tl_engine"] == ""
    assert float(rows["mccl-bf16"]["tl_ring_bytes"]) == pytest.approx(float(rows["mccl"]["tl_ring_bytes"]) / 2, rel=1e-3)
    with open(out / "timeline_steps.csv", newline="") as f:
        steps = list(csv.DictReader(f))
    # each launch's series, the compute series in each of them
    launched = [x.label for group in ddp_series.launches(ddp_series.parse(series)) for x in group]
    assert sorted((s["series"], s["step"]) for s in steps) == sorted((n, str(i)) for n in launched for i in range(2))
    for s in steps:
        if s["series"] in ("compute", "gloo"):
            assert s["tl_engine"] == "", s  # no engine timeline
        else:
            # each rank's parts add up to its own step, and the mean over ranks stays within the slowest rank's time
            assert 0 < sum(float(s[f"tl_{p}"]) for p in parts) <= float(s["time_s"]) * 1.01, s
        assert all(int(s[f"tcp_{c}"]) >= 0 for c in ("retrans_segs", "rto_timeouts", "loss_probes", "zero_windows")), s
        # no CPU above saturation (a step of a few ms can fall between two of /proc/stat's 10 ms ticks: 0)
        assert 0 <= float(s["cpu_max_busy"]) <= 1.0, s
        assert 0 <= float(s["cpu_softirq_cores"]) <= float(s["cpu_busy_cores"]) + 1e-6, s
    # over all the steps, the ranks kept at least a core busy in all (each rank's own process)
    busy_s = sum(float(s["cpu_busy_cores"]) * float(s["time_s"]) for s in steps)
    assert busy_s > 0.2 * sum(float(s["time_s"]) for s in steps), steps
    assert all(int(r["tcp_retrans_segs"]) >= 0 for r in rows.values())  # every series, Gloo's too
    md = (out / "results.md").read_text()
    assert "## Where the mccl steps go" in md
    assert "- model: vit_tiny_patch16_224, img 32, patch 8, depth 1, 10 classes" in md and "| 2 | 2 | mccl-bf16 |" in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "efficiency" in proc.stdout_text


def test_series_parsing_and_launches():
    s = ddp_series.parse("compute,mccl,mccl-bf16,gloo,mccl+powersgd,mccl:bucket=100:view:static:label=big")
    assert [(x.backend, x.wire, x.hook) for x in s] == [
        ("none", "", ""), ("mccl", "", ""), ("mccl", "bf16", ""), ("gloo", "", ""), ("mccl", "", "powersgd"),
        ("mccl", "", "")]
    assert s[-1].label == "big" and s[-1].ddp == {"bucket_cap_mb": 100.0, "gradient_as_bucket_view": True,
                                                  "static_graph": True}
    assert ddp_series.reference(s).label == "mccl"
    # a launch per wire type and one for PowerSGD alone, each with the compute series; the reference first
    assert [[x.label for x in g] for g in ddp_series.launches(s)] == [
        ["compute", "mccl", "gloo", "big"], ["compute", "mccl-bf16"], ["compute", "mccl+powersgd"]]
    assert [x.label for x in ddp_series.launches(ddp_series.parse("mccl-bf16,gloo"))[0]] == ["gloo"]
    # each PowerSGD series alone, the batched one too; neither is the weights' reference
    s = ddp_series.parse("mccl+powersgd,mccl+powersgd_batched:bucket=1000:label=pb")
    assert [x.powersgd for x in s] == [True, True] and ddp_series.reference(s) is None
    assert [[x.label for x in g] for g in ddp_series.launches(s)] == [["mccl+powersgd"], ["pb"]]
    # the ranks' variables: a launch per set, the wire type among them; Gloo with the series that set none
    s = ddp_series.parse("gloo,mccl:MCCL_NSOCKS=2,mccl-bf16:MCCL_NSOCKS=2:label=b,mccl")
    assert s[1].env == {"MCCL_NSOCKS": "2"} and s[2].env == {"MCCL_NSOCKS": "2", "MCCL_WIRE_DTYPE": "bf16"}
    assert ddp_series.DDPSeries.from_json(s[2].to_json()) == s[2]
    assert [[x.label for x in g] for g in ddp_series.launches(s)] == [["gloo", "mccl"], ["mccl:MCCL_NSOCKS=2"], ["b"]]


@pytest.mark.parametrize("text, message", [
    ("nccl", "unknown backend 'nccl'"), ("gloo-bf16", "mccl-bf16 or mccl-fp16"), ("mccl+topk", "unknown hook"),
    ("mccl:bucket=x", "bad option 'bucket=x'"), ("mccl,mccl", "appear twice"), ("compute", "no DDP series"),
    ("mccl:MCCL_WIRE_DTYPE=bf16", "the wire type is mccl-bf16"), ("gloo:MCCL_NSOCKS=2", "for mccl series"),
    ("compute:MCCL_NSOCKS=2,mccl", "compute has no DDP settings or variables"),
])
def test_series_errors(text, message):
    with pytest.raises(ValueError, match=message):
        ddp_series.parse(text)
