"""Smoke test of benchmarks/convergence.py: 2 CPU ranks, a one-block ViT on 8x8 glyphs, 16 steps, the two methods
that exist on main (synchronous DDP and torch's bf16 hook) and one MCCLStrategy refuses. Checks the harness
(files and columns, the refused method reported and the others run, the projection from a step-times file, the
ranks ending with the same weights, the validation over the ranks' shards agreeing with each rank's own), never
the accuracies. The statistics, the step-time files and the budget plan are checked in one process."""
from __future__ import annotations

import csv

import pytest

from bench_runner import explain, run_script
from accuracy import methods, step_times, summary
from accuracy.summary import Outcome

CURVE_COLUMNS = ["method", "seed", "step", "samples", "val_acc", "val_loss", "train_loss", "stand_in_step_ms",
                 "projected_s"]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_convergence_writes_outputs_and_ranks_agree(tmp_path):
    out, fleet = tmp_path / "out", tmp_path / "fleet.csv"
    fleet.write_text("series,world,batch_per_rank,time_median_s\ncompute,8,8,0.1\nmccl,8,8,0.5\nmccl,2,8,9\n")
    proc = run_script("convergence.py", "--nproc", 2, "--methods", "ddp-fp32,bf16-hook",
                      "--method", 'nope={"compress": "zstd"}', "--samples", 64, "--batch", 2, "--evals", 2,
                      "--model-kwargs", '{"embed_dim": 32, "depth": 1, "num_heads": 2}', "--image-size", 8,
                      "--classes", 4, "--train-size", 256, "--val-size", 64, "--step-times", fleet,
                      "--out", out, "--timeout", 100, timeout=150)
    assert proc.returncode == 0, explain(proc)
    summ = {r["method"]: r for r in _rows(out / "summary.csv")}
    assert list(summ) == ["ddp-fp32", "bf16-hook", "nope"]
    assert summ["nope"]["status"].startswith("unavailable: ValueError: MCCLStrategy(compress='zstd')"), summ["nope"]
    for name in ("ddp-fp32", "bf16-hook"):
        r = summ[name]
        assert r["status"] == "ok" and r["steps"] == "16" and r["seeds"] == "0", r
        assert r["ranks_same_weights"] == "yes" and float(r["rank_acc_spread"]) == 0.0, r
        assert 0.0 <= float(r["final_acc_mean"]) <= 1.0 and float(r["final_loss_mean"]) > 0, r
    # the step times: the file's mccl series at 8 ranks x batch 8 for DDP, the figure for the bf16 hook
    assert float(summ["ddp-fp32"]["stand_in_step_ms"]) == 500.0 and summ["ddp-fp32"]["step_time_source"].endswith(": mccl")
    assert float(summ["bf16-hook"]["stand_in_step_ms"]) == 393.0
    assert summ["bf16-hook"]["verdict"] == "no target" and summ["bf16-hook"]["within_noise"] == "unknown (1 seed)"
    curves = _rows(out / "curves.csv")
    assert list(curves[0]) == CURVE_COLUMNS
    assert [(r["method"], r["step"]) for r in curves] == [(m, s) for m in ("ddp-fp32", "bf16-hook") for s in ("8", "16")]
    for r in curves:
        assert int(r["samples"]) == 4 * int(r["step"]), r  # 2 ranks x 2 images a step
        assert float(r["projected_s"]) == pytest.approx(int(r["step"]) * float(r["stand_in_step_ms"]) / 1e3), r
    # synchronous methods: the last point (the ranks' shards, all-reduced) is each rank's own whole-set accuracy
    for name in ("ddp-fp32", "bf16-hook"):
        last = [r for r in curves if r["method"] == name][-1]
        assert float(last["val_acc"]) == pytest.approx(float(summ[name]["final_acc_mean"]), abs=1e-9)
    md = (out / "results.md").read_text()
    assert "- command: `benchmarks/convergence.py --nproc 2" in md and "| method | status |" in md
    assert "| nope | unavailable: ValueError" in md and "## Validation accuracy (%) against samples" in md
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # the data and the ranks' files removed
    assert "final val acc" in proc.stdout_text


def _outcome(name, accs_by_seed, max_loss=None):
    m = methods.Method(name, {}, max_loss)
    runs = {seed: [{"final_acc": a, "final_loss": 1.0, "weights_sha256": "x", "fit_s": 1.0, "curve": []}
                   for a in accs] for seed, accs in accs_by_seed.items()}
    return Outcome(m, "ok", runs)


def test_statistics_pair_seeds_and_judge_targets():
    ref = _outcome("ddp-fp32", {0: [0.70, 0.70], 1: [0.72, 0.72], 2: [0.68, 0.68]})
    close = _outcome("int8", {0: [0.699, 0.699], 1: [0.719, 0.719], 2: [0.681, 0.681]}, 0.5)
    far = _outcome("diloco-h4", {0: [0.66, 0.68], 1: [0.70, 0.70], 2: [0.65, 0.65]}, 1.0)
    st = summary.compare([ref, close, far])
    # paired by seed: the seeds' common swing (0.68-0.72) is no noise for the difference
    assert st["int8"].delta_pts == pytest.approx(-0.0333, abs=1e-3)
    assert st["int8"].noise_pts < 0.2 and st["int8"].verdict == "met (target >= -0.5 pts)"
    assert summary.within_noise(st["int8"]) == "yes"
    # the ranks' mean per seed (0.67 at seed 0), a spread between ranks, differences -3, -2 and -3 points
    assert st["diloco-h4"].finals[0] == pytest.approx(0.67) and st["diloco-h4"].rank_spread == pytest.approx(0.02)
    assert st["diloco-h4"].delta_pts == pytest.approx(-2.6667, abs=1e-3)
    assert st["diloco-h4"].verdict.startswith("missed by 1.67 pts")
    assert summary.verdict(-0.8, 0.5, 1.0).startswith("unresolved")
    assert summary.verdict(-0.4, None, 0.5).startswith("met (target >= -0.5 pts; one seed")


def test_step_times_and_budget(tmp_path):
    import convergence

    chosen = methods.select(["int8", "diloco-h4"])
    assert [m.name for m in chosen] == ["ddp-fp32", "int8", "diloco-h4"]  # the reference always runs
    assert methods.diloco_periods(methods.select(None)) == [2, 4]
    assert convergence.plan_steps(16384, 64, 8, [2, 4]) == (256, 32)
    assert convergence.plan_steps(16384, 64, 8, [8, 32]) == (256, 32)
    assert convergence.plan_steps(1000, 10, 3, []) == (99, 33)
    times = step_times.resolve(chosen, [], [])
    assert times["ddp-fp32"].ms == 622.0 and times["int8"].ms is None and times["compute"].ms == 251.0
    f = tmp_path / "f.csv"
    f.write_text("series,world,batch_per_rank,time_median_s\nmy-int8,8,8,0.3\n")
    times = step_times.resolve(chosen, [str(f)], ["int8=my-int8"])
    assert times["int8"].ms == pytest.approx(300.0) and times["ddp-fp32"].ms == 622.0
    with pytest.raises(ValueError, match="no such series"):
        step_times.resolve(chosen, [str(f)], ["int8=mccl+int8"])
    with pytest.raises(ValueError, match="no rows at 16 ranks"):
        step_times.resolve(chosen, [str(f)], [], world=16)
    with pytest.raises(ValueError, match="METHOD=SERIES"):
        step_times.resolve(chosen, [], ["powersgd=x"])
    with pytest.raises(ValueError, match="unknown"):
        methods.select(["int9"])
    with pytest.raises(ValueError, match="already a method"):
        methods.select(None, ['int8={"compress": "int8"}'])
    # --method alone runs that method and the reference, not the whole table beside it
    assert [m.name for m in methods.select(None, ['h3={"strategy": "MCCLDiLoCoStrategy", "sync_every": 3}'])] == [
        "ddp-fp32", "h3"]
    assert [m.name for m in methods.select(["int8"], ['h3={"sync_every": 3}'])] == ["ddp-fp32", "int8", "h3"]
