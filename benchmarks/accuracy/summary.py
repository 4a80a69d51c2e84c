"""The convergence benchmark's statistics: each method's final accuracy over seeds, its difference from the
reference (paired by seed: same initial model, same data order), whether that difference is within the
seed-to-seed noise, and whether it meets its target.

A run of a method at one seed ends with a validation accuracy per rank (the whole validation set on each rank,
after fit): its value is the mean over the ranks (the same number on every rank when the ranks end with the same
weights). Over seeds: mean and sample standard deviation. The difference from the reference is the mean over
the seeds both ran of (method - reference), in points; its noise is twice the standard error of those paired
differences (2 sd / sqrt(n), about a 95% interval; unknown with one seed). A target (at most X points below
the reference) is met when even the low end of that interval is above -X, missed when even its high end is
below -X, and unresolved in between (more seeds narrow it).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .methods import REFERENCE, Method


@dataclass
class Outcome:
    """One method's launch: status "ok", "unavailable: <error>" or "failed: <error>", and per seed the ranks'
    results (accuracy/rank.py's runs, by rank)."""

    method: Method
    status: str
    runs: Dict[int, List[dict]] = field(default_factory=dict)  # seed -> [rank 0's run, rank 1's, ...]

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Stats:
    seeds: List[int]
    finals: List[float]  # per seed: mean over ranks of the final accuracy
    losses: List[float]
    rank_spread: float  # largest (max - min) over ranks of a seed's final accuracy
    same_weights: bool  # every seed's ranks ended with the same weights
    fit_s: float  # mean over seeds of the slowest rank's Trainer.fit on this machine
    mean: float
    sd: Optional[float]
    delta_pts: Optional[float] = None
    noise_pts: Optional[float] = None  # 2 standard errors of the paired difference
    verdict: str = ""


def stats(outcome: Outcome) -> Optional[Stats]:
    if not outcome.ok or not outcome.runs:
        return None
    seeds = sorted(outcome.runs)
    finals = [statistics.fmean(r["final_acc"] for r in outcome.runs[s]) for s in seeds]
    losses = [statistics.fmean(r["final_loss"] for r in outcome.runs[s]) for s in seeds]
    spread = max(max(r["final_acc"] for r in outcome.runs[s]) - min(r["final_acc"] for r in outcome.runs[s])
                 for s in seeds)
    same = all(len({r["weights_sha256"] for r in outcome.runs[s]}) == 1 for s in seeds)
    fit_s = statistics.fmean(max(r["fit_s"] for r in outcome.runs[s]) for s in seeds)
    return Stats(seeds, finals, losses, spread, same, fit_s, statistics.fmean(finals),
                 statistics.stdev(finals) if len(finals) > 1 else None)


def compare(outcomes: Sequence[Outcome]) -> Dict[str, Stats]:
    """Stats of every method that ran, with the difference from the reference and the target's verdict."""
    out = {o.method.name: s for o in outcomes if (s := stats(o)) is not None}
    ref = out.get(REFERENCE)
    for o in outcomes:
        s = out.get(o.method.name)
        if s is None or ref is None or o.method.name == REFERENCE:
            continue
        paired = [100 * (a - ref.finals[ref.seeds.index(seed)]) for seed, a in zip(s.seeds, s.finals)
                  if seed in ref.seeds]
        if not paired:
            continue
        s.delta_pts = statistics.fmean(paired)
        s.noise_pts = 2 * statistics.stdev(paired) / math.sqrt(len(paired)) if len(paired) > 1 else None
        s.verdict = verdict(s.delta_pts, s.noise_pts, o.method.max_loss_pts)
    return out


def verdict(delta: float, noise: Optional[float], max_loss: Optional[float]) -> str:
    if max_loss is None:
        return "no target"
    limit = f"target >= -{max_loss:g} pts"
    if noise is None:
        met = "met" if delta >= -max_loss else f"missed by {-max_loss - delta:.2f} pts"
        return f"{met} ({limit}; one seed: noise unknown)"
    if delta - noise >= -max_loss:
        return f"met ({limit})"
    if delta + noise < -max_loss:
        return f"missed by {-max_loss - delta:.2f} pts ({limit})"
    return f"unresolved: {delta:+.2f} ± {noise:.2f} straddles -{max_loss:g} (more seeds)"


def within_noise(s: Stats) -> str:
    if s.delta_pts is None:
        return ""
    if s.noise_pts is None:
        return "unknown (1 seed)"
    return "yes" if abs(s.delta_pts) <= s.noise_pts else "no"


def mean_curve(outcome: Outcome) -> List[dict]:
    """The validation curve averaged over seeds, point by point (every seed has the same eval steps)."""
    curves = [runs[0]["curve"] for _, runs in sorted(outcome.runs.items())]
    if not curves:
        return []
    out = []
    for points in zip(*curves):
        row = {"step": points[0]["step"], "samples": points[0]["samples"]}
        for key in ("val_acc", "val_loss", "train_loss"):
            row[key] = statistics.fmean(p[key] for p in points)
        out.append(row)
    return out
