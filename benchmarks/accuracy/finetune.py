"""The fine-tuning case of `benchmarks/convergence.py --finetune`: the task the pretrained model is fine-tuned on,
and what its features are worth there before any fine-tuning.

The fine-tuning task is the pretraining task with SHIFT applied (benchmarks/record/convergence.md, *Fine-tuning*): other
classes (glyphs from another seed, fewer of them), other stroke statistics (more strokes per glyph, thinner,
less jitter, fewer left out), a busier and stronger background, and its own, smaller set of images. Everything
else (image size, noise, distractors) is the pretraining task's.

The linear probe: a linear classifier fitted (full batch, L-BFGS) to the backbone's pooled features of the
fine-tuning task's training images, scored on its validation images: with the pretrained backbone, and with
the same architecture at its random initialisation. The first above the second says that the pretrained
features carry over to the new task; fine-tuning the whole model should end above both.
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace

import torch
import torch.nn.functional as F

from .task import GlyphTask

SHIFT = {"glyph_seed": 1, "classes": 16, "strokes": 5, "width": 1.0, "jitter": 0.5, "keep": 0.9,
         "background": 0.4, "grain": 6, "train_size": 8192, "data_seed": 1}
PROBE_ITERATIONS = 100  # L-BFGS iterations: the probe's loss has levelled off long before
PROBE_WEIGHT_DECAY = 1e-4
FEATURE_BATCH = 1024


def shifted(pretraining: GlyphTask, overrides: dict) -> GlyphTask:
    """The fine-tuning task: `pretraining` with SHIFT and then `overrides` applied. ValueError naming a field
    the task does not have."""
    if not isinstance(overrides, dict):
        raise ValueError(f"--finetune-task {json.dumps(overrides)}: write a JSON object of the glyph task's settings, "
                         f"e.g. '{{\"classes\": 8}}'")
    unknown = sorted(set(overrides) - set(asdict(pretraining)))
    if unknown:
        raise ValueError(f"--finetune-task: the glyph task has no {', '.join(unknown)} (it has "
                         f"{', '.join(asdict(pretraining))})")
    return replace(pretraining, **{**SHIFT, **overrides})


def probes(model: dict, classes: int, tensors, device: str) -> dict:
    """{"pretrained": the probe's accuracy on the backbone in model["checkpoint_path"], "random": on the same
    architecture at its initialisation from seed 0}; `model`: ConvergenceViT's arguments."""
    from .rank import ConvergenceViT

    out = {}
    for name, args in (("pretrained", model), ("random", {k: v for k, v in model.items() if k != "checkpoint_path"})):
        torch.manual_seed(0)
        out[name] = linear_probe(ConvergenceViT(**args).model, classes, tensors, device)
    return out


def linear_probe(backbone: torch.nn.Module, classes: int, tensors, device: str) -> float:
    """Validation accuracy of a linear classifier on `backbone`'s pooled features (a timm ViT; frozen)."""
    x, y, vx, vy = tensors
    backbone = backbone.to(device).eval()
    train, val = _features(backbone, x, device), _features(backbone, vx, device)
    mean, std = train.mean(0), train.std(0).clamp_min(1e-6)
    train, val = (train - mean) / std, (val - mean) / std
    y, vy = y.to(device), vy.to(device)
    torch.manual_seed(0)
    head = torch.nn.Linear(train.shape[1], classes).to(device)
    opt = torch.optim.LBFGS(head.parameters(), max_iter=PROBE_ITERATIONS, history_size=20,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(head(train), y) + PROBE_WEIGHT_DECAY * head.weight.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float((head(val).argmax(1) == vy).float().mean())


def _features(backbone: torch.nn.Module, images: torch.Tensor, device: str) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([backbone.forward_head(backbone.forward_features(images[i:i + FEATURE_BATCH].to(device)),
                                                pre_logits=True) for i in range(0, len(images), FEATURE_BATCH)])
