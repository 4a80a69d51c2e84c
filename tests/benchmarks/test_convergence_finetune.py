"""benchmarks/convergence.py --finetune end to end at a tiny size: 2 CPU ranks, a one-block ViT on 8x8 glyphs, the
reference, one method of each kind (a compressed exchange, DiLoCo) and the from-scratch control at two seeds (a
launch per method costs most of the test's time; every method at its full size is benchmarks/record/convergence.md's run).
Checks that fine-tuning works (the fine-tuned DDP model beats DDP from random weights on the same steps by a
margin, at every seed: equal if the pretrained weights were not loaded, on the CPU bit for bit), that the
pretrained model is cached and a second run reuses it, and that the CSVs hold every method and seed. The cache
key, the fine-tuning task and the from-scratch task's unchanged images are checked in one process."""
from __future__ import annotations

import csv
import hashlib
import json
import os

import pytest

from bench_runner import explain, run_script
from accuracy import finetune, methods, pretrain
from accuracy.task import GlyphTask

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)

# A pretraining task the tiny model learns in a few hundred steps (no clutter, no noise), and a fine-tuning task of
# 8 new glyphs of the same kind on 8x8 images, 128 of them (the shift's other changes are too much for 8x8 pixels
# and a 32-wide block). The pretrained model reaches about 0.97 on its task; in one process with the same global
# batch, fine-tuning reached 0.56-0.78 on the new task after 32 steps of 8 images at seeds 0-5, DDP from random
# weights 0.21-0.28 (chance 0.125).
TINY = ["--nproc", 2, "--batch", 4, "--samples", 256, "--evals", 2, "--image-size", 8, "--classes", 8,
        "--model-kwargs", '{"embed_dim": 32, "depth": 1, "num_heads": 2}', "--shift", 0, "--noise", 0,
        "--background", 0, "--distractors", 0, "--train-size", 2048, "--val-size", 256,
        "--finetune-task", json.dumps({"classes": 8, "strokes": 4, "width": 1.5, "background": 0, "grain": 3,
                                       "train_size": 128}),
        "--pretrain-steps", 300, "--finetune"]
MARGIN = 0.15  # fine-tuned DDP above DDP from random weights, at every seed


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _snapshot(cache):
    return {str(p.relative_to(cache)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in cache.rglob("*") if p.is_file()}


def test_finetune_beats_scratch_and_reuses_the_pretrained_model(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out"
    proc = run_script("convergence.py", *TINY, "--methods", "int8,diloco-h2,ddp-fp32-scratch", "--seeds", 0, 1,
                      "--pretrain-cache", cache, "--out", out, "--timeout", 120, timeout=420)
    assert proc.returncode == 0, explain(proc)
    assert "pretrained model: none in" in proc.stderr_text
    summ = {r["method"]: r for r in _rows(out / "summary.csv")}
    names = ["ddp-fp32", "int8", "diloco-h2", "ddp-fp32-scratch"]
    assert list(summ) == names
    for r in summ.values():
        assert r["status"] == "ok" and r["seeds"] == "0 1" and r["ranks_same_weights"] == "yes", r
    curves = _rows(out / "curves.csv")
    assert {(r["method"], r["seed"]) for r in curves} == {(n, s) for n in names for s in ("0", "1")}
    # fine-tuning works: at every seed (the same head's initialisation and data order) far above the control
    tuned = [float(a) for a in summ["ddp-fp32"]["final_acc_by_seed"].split()]
    scratch = [float(a) for a in summ["ddp-fp32-scratch"]["final_acc_by_seed"].split()]
    assert all(t > s + MARGIN for t, s in zip(tuned, scratch)), (tuned, scratch)
    saved = json.loads((out / "pretrained.json").read_text())
    folder = cache / saved["record"]["key"]
    assert saved["weights"] == str(folder / pretrain.WEIGHTS) and saved["record"]["seed"] == 0
    assert saved["record"]["command"].startswith("benchmarks/convergence.py --nproc 2")
    assert saved["record"]["pretraining"]["steps"] == 300 and saved["record"]["pretrain_val_acc"] > 0.6
    assert all(0 < saved["linear_probe"][k] <= 1 for k in ("pretrained", "random")), saved["linear_probe"]
    md = (out / "results.md").read_text()
    assert "steps of fine-tuning, every method" in md and "- pretrained model: 300 steps" in md
    # the second run (with --pretrain-only: no launch) finds it and rewrites nothing
    before = _snapshot(cache)
    again = run_script("convergence.py", *TINY, "--pretrain-cache", cache, "--pretrain-only", timeout=120)
    assert again.returncode == 0, explain(again)
    assert f"pretrained model: reusing {folder}" in again.stderr_text, explain(again)
    assert _snapshot(cache) == before


BASE = pretrain.Pretraining(GlyphTask(classes=4), {"model_name": "vit_tiny_patch16_224", "lr": 1e-3}, 100, 64, 0,
                            "cpu")


@pytest.mark.parametrize("change", [
    {"task": GlyphTask(classes=4, noise=0.2)}, {"task": GlyphTask(classes=4, glyph_seed=3)},
    {"model": {"model_name": "vit_tiny_patch16_224", "lr": 2e-3}}, {"steps": 101}, {"batch": 32}, {"seed": 1},
    {"device": "cuda"},
])
def test_the_cache_key_covers_what_determines_the_weights(change):
    from dataclasses import replace

    assert BASE.key() == pretrain.Pretraining(**{**BASE.__dict__}).key()
    assert replace(BASE, **change).key() != BASE.key()


def test_the_cache_key_covers_the_task_code_not_its_prose(tmp_path, monkeypatch):
    for name in ("task.py", "pretrain.py"):
        (tmp_path / name).write_bytes(open(os.path.join(pretrain.HERE, name), "rb").read())
    monkeypatch.setattr(pretrain, "HERE", str(tmp_path))
    key = BASE.key()
    task = (tmp_path / "task.py").read_text()
    prose = task.replace('"""The convergence benchmark\'s task', '"""The task', 1).replace("\n", "  # a comment\n", 3)
    assert prose != task
    (tmp_path / "task.py").write_text(prose)
    assert BASE.key() == key
    (tmp_path / "task.py").write_text(task.replace("* s / 16.0", "* s / 15.0"))
    assert BASE.key() != key


def test_the_finetuning_task_is_the_pretraining_task_shifted():
    base = GlyphTask(classes=8, image_size=8, noise=0.05, train_size=64, val_size=32)
    shifted = finetune.shifted(base, {"classes": 6, "train_size": 48})
    assert shifted.noise == 0.05 and shifted.image_size == 8  # kept
    assert (shifted.classes, shifted.train_size, shifted.glyph_seed) == (6, 48, finetune.SHIFT["glyph_seed"])
    assert (shifted.strokes, shifted.width, shifted.grain) == (finetune.SHIFT["strokes"], finetune.SHIFT["width"],
                                                               finetune.SHIFT["grain"])
    x, y, vx, vy = shifted.generate()
    assert x.shape == (48, 3, 8, 8) and vx.shape == (32, 3, 8, 8) and set(y.tolist()) <= set(range(6))
    with pytest.raises(ValueError, match="the glyph task has no colour"):
        finetune.shifted(base, {"colour": 1})
    with pytest.raises(ValueError, match="grain >= 1"):
        GlyphTask(grain=0)


def test_the_from_scratch_task_draws_the_same_images_as_before():
    """The glyph seed, stroke width and background grain at their defaults leave the task's random stream and
    its images as they were (the recorded runs stay reproducible): labels exactly, pixels to float precision, as
    drawn by task.py before those parameters existed."""
    x, y, vx, vy = GlyphTask(classes=4, image_size=8, train_size=64, val_size=32).generate()
    assert y.tolist() == [0, 0, 0, 2, 3, 0, 3, 2, 3, 3, 1, 1, 1, 0, 1, 1, 1, 3, 0, 3, 1, 2, 0, 1, 2, 0, 2, 0, 1, 3,
                          2, 2, 1, 0, 3, 1, 1, 3, 0, 2, 2, 3, 2, 3, 3, 3, 2, 1, 2, 2, 3, 2, 3, 3, 2, 2, 3, 0, 1, 2,
                          3, 2, 1, 2]
    assert vy.tolist() == [3, 3, 0, 2, 1, 2, 3, 2, 0, 0, 3, 0, 1, 3, 3, 3, 3, 0, 3, 0, 1, 3, 1, 2, 2, 3, 2, 2, 0, 0,
                           2, 2]
    assert float(x.double().sum()) == pytest.approx(-120.9446792122908, abs=1e-3)
    assert float(vx.double().sum()) == pytest.approx(-43.28990429348778, abs=1e-3)
    assert x[0, :, 3, 3].tolist() == pytest.approx([0.23140855, 0.33731046, 0.47059947], abs=1e-5)
    assert vx[-1, :, 4, 2].tolist() == pytest.approx([-0.38684449, -0.14803702, 0.16257632], abs=1e-5)


def test_controls_run_last_and_only_when_fine_tuning():
    assert [m.name for m in methods.select(None, controls=True)][-1] == "ddp-fp32-scratch"
    chosen = methods.select(["ddp-fp32-scratch", "int8"], ['h3={"sync": "diloco", "sync_every": 3}'], controls=True)
    assert [m.name for m in chosen] == ["ddp-fp32", "int8", "h3", "ddp-fp32-scratch"]
    assert chosen[-1].random_init and not any(m.random_init for m in chosen[:-1])
    with pytest.raises(ValueError, match="unknown \\['ddp-fp32-scratch'\\]"):
        methods.select(["ddp-fp32-scratch"])


def test_a_diloco_variant_is_one_line_and_unavailable_until_the_strategy_takes_it():
    import convergence

    built = methods._diloco("diloco-h4-warm32", 4, 1.0, (), warm_start=32)
    assert (built.strategy, built.cls) == ({"sync_every": 4, "warm_start": 32}, "MCCLDiLoCoStrategy")
    assert convergence.refusal(built, {"comm_metrics": False}) == "ok"
    variant = methods._diloco("diloco-h4-later", 4, 1.0, (), warm_start_steps_not_built=32)
    status = convergence.refusal(variant, {"comm_metrics": False})
    assert status.startswith("unavailable: MCCLDiLoCoStrategy takes no warm_start_steps_not_built"), status
    assert methods.diloco_periods([variant]) == [4]


@pytest.mark.parametrize("args, message", [
    (["--pretrain-only"], "--pretrain-only: only with --finetune"),
    (["--finetune", "--finetune-task", "[1]"], "--finetune-task [1]: write a JSON object"),
    (["--finetune", "--finetune-task", '{"colour": 1}'], "--finetune-task: the glyph task has no colour"),
    (["--finetune", "--pretrain-steps", "0"], "--pretrain-steps 0, --pretrain-batch 64: at least 1 each"),
    (["--methods", "ddp-fp32-scratch"], "unknown ['ddp-fp32-scratch']"),
])
def test_bad_options_are_named(args, message, capsys):
    import convergence

    with pytest.raises(SystemExit) as e:
        convergence.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err
