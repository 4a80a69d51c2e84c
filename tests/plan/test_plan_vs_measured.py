"""benchmarks/plan_vs_measured.py on a made-up fleet_ddp result folder: each row's method read from its columns,
the profile shared by the number of processes nearest the row's hosts chosen, both predictions against hand-computed
steps, and the 10% verdict in the exit code."""
from __future__ import annotations

import csv
import os
import sys

import pytest

from lightning_mccl.plan.profile import Kernels, Param, PowerSGDCost, Profile, save

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import plan_vs_measured  # noqa: E402


def profile(share: int, step: float) -> Profile:
    # one 100 MB matrix ready when the backward pass ends, 10 ms before the step's end
    return Profile(model="vit_test", model_args={}, batch=8, device="cuda", device_name="test", share_device=share,
                   steps=1, warmup=1, optimizer="SGD", forward_s=0.1, backward_s=step - 0.01, step_s=step,
                   params=(Param("w", (5000, 5000), 4, step - 0.01),),
                   kernels=Kernels(powersgd={1: PowerSGDCost(0.0, 0.0, 0.0)}))


COLUMNS = ["model", "world", "batch_per_rank", "series", "backend", "wire_dtype", "hook", "ddp_options",
           "time_median_s", "step_s", "sync_every", "sync_delay"]


def row(series, backend="mccl", hook="", wire="", ddp="", step=0.5, world=8, **extra):
    return {"model": "vit_test", "world": world, "batch_per_rank": 8, "series": series, "backend": backend,
            "wire_dtype": wire, "hook": hook, "ddp_options": ddp, "time_median_s": step, "step_s": step,
            "sync_every": "", "sync_delay": "", **extra}


def test_each_rows_method_comes_from_its_columns():
    def kind(r):
        m = plan_vs_measured.method_of(r, powersgd_rank=4)
        return m and (m[0], m[1].bucket_mb, m[1].first_bucket_mb, m[1].powersgd_rank, m[1].sync_every,
                      m[1].sync_delay, m[1].diloco_wire, m[1].powersgd_bucket_mb)
    assert kind(row("mccl")) == ("ddp", 25.0, 1.0, 1, 3, 1, "bf16", 1000.0)  # DDP's own buckets
    assert kind(row("m5", ddp="bucket_cap_mb=5.0"))[:3] == ("ddp", 5.0, 5.0)
    assert kind(row("b", hook="bf16_hook", ddp="bucket_cap_mb=5.0"))[0] == "bf16"
    i = plan_vs_measured.method_of(row("i", hook="int8", ddp="bucket_cap_mb=5.0"), powersgd_rank=4)
    assert (i[0], i[1].int8_bucket_mb, i[1].first_bucket_mb) == ("int8", 5.0, 5.0)
    assert kind(row("p", hook="powersgd_batched", ddp="bucket_cap_mb=1000.0")) == (
        "powersgd", 5.0, 1000.0, 4, 3, 1, "bf16", 1000.0)
    assert kind(row("d", wire="bf16", sync_every="16", sync_delay="2"))[4:7] == (16, 2, "bf16")
    assert kind(row("d32", sync_every="8", sync_delay="1"))[6] == "float32"
    fragments = plan_vs_measured.method_of(row("f4", wire="bf16", sync_every="4", sync_delay="1", fragments="4"), 1)
    assert fragments[1].fragments == 4
    assert plan_vs_measured.method_of(row("d", wire="bf16", sync_every="4", sync_delay="1"), 1)[1].fragments == 1
    for other in (row("gloo", backend="gloo"), row("compute", backend="none"), row("w", wire="bf16"),
                  row("p1", hook="powersgd"), row("f", hook="fp16_hook")):
        assert plan_vs_measured.method_of(other, 1) is None


def test_each_row_takes_the_profile_shared_by_the_nearest_number_of_processes():
    shares = [profile(n, 0.2) for n in (1, 4, 8)]
    pick = lambda hosts: plan_vs_measured.pick_profile(shares, hosts).share_device  # noqa: E731
    assert [pick(h) for h in (1, 2, 3, 4, 6, 8, 16, 24)] == [1, 1, 4, 4, 8, 8, 8, 8]  # 6: 4 and 8 as near, the larger
    assert plan_vs_measured.pick_profile([], 8) is None


def test_predictions_against_a_measured_folder(tmp_path, capsys):
    folder = tmp_path / "fleet_h8"
    folder.mkdir()
    with open(folder / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows([row("compute", backend="none", step=0.3), row("mccl", ddp="bucket_cap_mb=1000.0", step=0.48),
                     row("gloo", backend="gloo", step=0.7)])
    alone, shared = str(tmp_path / "alone.json"), str(tmp_path / "shared.json")
    save(profile(1, 0.2), alone)
    save(profile(8, 0.25), shared)
    out = tmp_path / "out"
    code = plan_vs_measured.main(["--measured", str(folder), "--profile", alone, "--profile", shared,
                                  "--out", str(out)])
    with open(out / "comparison.csv") as f:
        (r,) = list(csv.DictReader(f))
    # the 8-process profile; one 100 MB bucket at 240 ms on 8 hosts: 175 MB of ring at 1.1955 GB/s, 14 ring
    # steps and the collective's latency, then 10 ms of optimizer step
    wire = 2 * 7 / 8 * 100e6 / (10e9 * 1448 / 1514 / 8) + 180e-6 + 14 * 15e-6
    assert (r["series"], r["method"], int(r["profile_share_device"])) == ("mccl", "ddp", 8)
    assert float(r["predicted_s"]) == pytest.approx(0.25 + wire)
    assert float(r["predicted_run_s"]) == pytest.approx(0.3 + wire)  # the profile scaled to the run's compute
    assert float(r["error_s"]) == pytest.approx((0.25 + wire) / 0.48 - 1)
    assert code == 1  # 0.40 against 0.48 is outside 10%
    assert "0 of 1 rows at 4 and 8 hosts within 10%" in capsys.readouterr().err
    assert (out / "comparison.png").exists() and "| 8 | 8 | mccl (ddp) | 480 |" in (out / "comparison.md").read_text()
