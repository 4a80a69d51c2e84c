"""The fleet benchmark's DiLoCo series (benchmarks/fleet_ddp.py --series ...+diloco:H=..): 2 CPU ranks, a one-block
ViT, bf16 pseudo-gradients. Checks the harness, never the timings: the series' step time is the mean per inner
step over the whole rounds of its timed steps (read back from timeline_steps.csv), which samples/s and the
efficiency use; its weights are reported against the exact series, not held to a tolerance. Parsing in one
process: the grammar, a launch of its own per DiLoCo series, the errors."""
from __future__ import annotations

import csv

import pytest

from bench_runner import explain, run_script
from sweep import ddp_series


def test_the_diloco_series_reports_whole_rounds(tmp_path):
    out = tmp_path / "out"
    proc = run_script("fleet_ddp.py", "--nproc", 2, "--device", "cpu", "--model", "vit_tiny_patch16_224",
                      "--img-size", 32, "--patch-size", 8, "--depth", 1, "--num-classes", 10, "--batch", 2,
                      "--steps", 5, "--warmup", 1, "--series",
                      "compute,mccl-bf16+diloco:H=2:label=diloco,mccl+diloco:H=2:frag=2:label=frag",
                      "--out", out, "--timeout", 100, timeout=150)
    assert proc.returncode == 0, explain(proc)
    with open(out / "results.csv", newline="") as f:
        rows = {r["series"]: r for r in csv.DictReader(f)}
    with open(out / "timeline_steps.csv", newline="") as f:
        steps = [float(s["time_s"]) for s in csv.DictReader(f) if s["series"] == "diloco"]
    r = rows["diloco"]
    assert (r["sync_every"], r["sync_delay"], r["rounds_timed"], r["wire_dtype"]) == ("2", "1", "2", "bf16"), r
    # warm-up step 0, timed steps 1-5: whole rounds are steps 2-5 (after the round of steps 0-1)
    assert float(r["step_s"]) == pytest.approx(sum(steps[1:5]) / 4, rel=1e-9)
    assert float(r["samples_per_s"]) == pytest.approx(4 / float(r["step_s"]), rel=1e-9)
    assert float(r["efficiency"]) == pytest.approx(float(r["compute_median_s"]) / float(r["step_s"]), rel=1e-9)
    assert r.get("weights_match", "") == "" and r["hook"] == "" and r["ddp_options"] == ""  # no exact series here
    assert (rows["frag"]["fragments"], rows["frag"]["rounds_timed"], r["fragments"]) == ("2", "2", "1"), rows["frag"]


def test_diloco_series_parsing():
    s = ddp_series.parse("compute,mccl,mccl-bf16+diloco:H=32:delay=2,gloo+diloco:H=8:frag=4:label=g")
    assert [(x.label, x.backend, x.wire, x.sync_every, x.sync_delay, x.fragments, x.diloco) for x in s[1:]] == [
        ("mccl", "mccl", "", 0, 1, 1, False), ("mccl-bf16+diloco:H=32:delay=2", "mccl", "bf16", 32, 2, 1, True),
        ("g", "gloo", "", 8, 1, 4, True)]
    assert ddp_series.DDPSeries.from_json(s[3].to_json()) == s[3]
    assert ddp_series.DDPSeries.from_json(s[2].to_json()) == s[2]
    assert [[x.label for x in g] for g in ddp_series.launches(s)] == [
        ["compute", "mccl"], ["compute", "mccl-bf16+diloco:H=32:delay=2"], ["compute", "g"]]
    assert ddp_series.reference(s[2:]) is None
    assert s[2].whole_rounds(4, 64) == range(28, 60)  # the rounds from step 32 to 95; the timed steps 4-67
    assert not s[2].whole_rounds(4, 40)


@pytest.mark.parametrize("text, message", [
    ("mccl+diloco", "DiLoCo takes H=STEPS"), ("mccl+diloco:H=4:bucket=5", "DiLoCo takes H=STEPS"),
    ("mccl+diloco:H=0", r"DiLoCo\(sync_every=0\)"), ("mccl+diloco:H=4:delay=5", r"DiLoCo\(sync_delay=5\)"),
    ("mccl+diloco:H=4:delay=x", "bad option 'delay=x'"), ("mccl+diloco:H=4:frag=0", r"DiLoCo\(fragments=0\)"),
    ("mccl:frag=2", "bad option 'frag=2'"),
])
def test_diloco_series_errors(text, message):
    with pytest.raises(ValueError, match=message):
        ddp_series.parse(text)
