"""What each way of training a fleet cost in accuracy on the project's benchmark task: one table, read by the
end-of-fit summary (`CommMetrics`), PowerSGD's warning at setup and `mccl plan`. No torch here.

A cost is the difference in final validation accuracy from synchronous float32 DDP, in points, paired by seed,
on the convergence benchmark's task (a ViT trained from random weights on 8 ranks, global batch 64,
benchmarks/record/convergence.md "The task"): measured there, not on the user's model. Each row names the record
that holds its runs and command. The spread is what the record gives: twice the standard error for
convergence.md's rows, the standard deviation of the paired differences for DiLoCo's sweep (diloco.md).

    mode                              cost (points)                          record (benchmarks/record/)
    DDP, float32 (compress=None)      the reference
    compress="bf16" / "bf16_hook"     -0.09 +- 0.17, 3 seeds                 convergence.md#results (bf16-hook)
    compress="int8"                   -0.07 +- 0.23, 32 seeds                convergence.md#int8-over-32-seeds-...
    compress="powersgd", rank 1 / 4   -32.56 +- 3.30 / -10.51 +- 1.96, 3 s.  convergence.md#results
    DiLoCo, plain averaging, H, tau   256 / 1024 / 2048 steps, 3 seeds       diloco.md#what-diloco-costs-in-accuracy
    the same, H = 4 in 4 fragments    -11.34 +- 3.00 after 256, 3 seeds      diloco.md#options-for-short-jobs-...

bf16 and int8 follow DDP's accuracy curve within the seeds' noise at every validation point, so they need the
steps DDP needs to reach an accuracy (`same_curve`). PowerSGD and DiLoCo end below it at the budgets measured;
how many more steps they would need was not measured. Any other setting (fp16, DiLoCo's outer momentum, int8
pseudo-gradients, another PowerSGD rank) is "not measured".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from .wire_policy import BF16, FLOAT32, INT8, POWERSGD, ROWS

DDP, DILOCO = "ddp", "diloco"  # Mode.sync
CONVERGENCE = "benchmarks/record/convergence.md#results"
INT8_SEEDS = "benchmarks/record/convergence.md#int8-over-32-seeds-2026-12-04"
DILOCO_SWEEP = "benchmarks/record/diloco.md#what-diloco-costs-in-accuracy"
DILOCO_SHORT = "benchmarks/record/diloco.md#options-for-short-jobs-preliminary"
TASK = "the project's benchmark task (a ViT from random weights, 8 ranks)"


class AccuracyCostWarning(UserWarning):
    """A communication mode that changes the arithmetic cost accuracy on the project's benchmark task."""


@dataclass(frozen=True)
class Cost:
    points: float  # mean difference in final validation accuracy from float32 DDP, in points
    spread: float  # +- as the record gives it (module docstring)
    seeds: int
    steps: int  # the training budget, in optimizer steps of 64 images
    record: str  # the record's page and section: the runs, their command and files
    same_curve: bool = False  # within the seeds' noise of DDP at every validation point

    def text(self) -> str:
        digits = 2 if abs(self.points) < 1 else 1
        return f"{self.points:+.{digits}f} ± {self.spread:.{digits}f} points"


@dataclass(frozen=True)
class Mode:
    """How a fit trains, as far as accuracy goes: what the summary names and the table is keyed by."""

    sync: str = DDP  # DDP or DILOCO
    compress: Optional[str] = None  # wire_policy's value: gradients (DDP) or pseudo-gradients (DiLoCo)
    powersgd_rank: Optional[int] = None  # compress="powersgd": matrix_approximation_rank
    sync_every: Optional[int] = None  # DiLoCo's H
    sync_delay: Optional[int] = None  # DiLoCo's tau
    plain_averaging: bool = True  # DiLoCo's outer step: outer_lr 1, no momentum, no outer_optimizer of one's own
    fragments: int = 1  # DiLoCo's fragments

    def describe(self) -> str:
        if self.sync == DILOCO:
            outer = "plain averaging" if self.plain_averaging else "an outer optimizer of its own"
            parts = f", {self.fragments} fragments" if self.fragments > 1 else ""
            return (f"DiLoCo, H = {self.sync_every}, tau = {self.sync_delay}{parts}, {outer}, pseudo-gradients in "
                    f"{ROWS[self.compress].name}")
        if self.compress is None:
            return "DDP, float32 gradients"
        rank = f", rank {self.powersgd_rank}" if self.compress == POWERSGD else ""
        return f"DDP, compress={self.compress!r}{rank}"


def _sweep(*budgets) -> Tuple[Cost, ...]:
    """DiLoCo's sweep: (steps, points, spread) per budget, 3 seeds."""
    return tuple(Cost(p, s, 3, steps, DILOCO_SWEEP) for steps, p, s in budgets)


# Keyed by `_key(mode)`: (DDP, gradient format[, PowerSGD rank]) or (DILOCO, H, tau, pseudo-gradient format[,
# fragments, when more than one]).
COSTS: Dict[tuple, Tuple[Cost, ...]] = {
    (DDP, FLOAT32): (),  # the reference
    (DDP, BF16): (Cost(-0.09, 0.17, 3, 256, CONVERGENCE, same_curve=True),),
    (DDP, INT8): (Cost(-0.07, 0.23, 32, 256, INT8_SEEDS, same_curve=True),),
    (DDP, POWERSGD, 1): (Cost(-32.56, 3.30, 3, 256, CONVERGENCE),),
    (DDP, POWERSGD, 4): (Cost(-10.51, 1.96, 3, 256, CONVERGENCE),),
    (DILOCO, 1, 1, FLOAT32): _sweep((256, -2.77, 1.25)),
    (DILOCO, 2, 1, FLOAT32): _sweep((256, -5.78, 2.61), (1024, -1.75, 0.06), (2048, -0.99, 0.37)),
    (DILOCO, 4, 1, FLOAT32): _sweep((256, -12.36, 5.19), (1024, -2.25, 0.54), (2048, -1.26, 0.48)),
    (DILOCO, 8, 1, FLOAT32): _sweep((256, -27.83, 2.31), (1024, -4.15, 0.60), (2048, -2.10, 0.26)),
    (DILOCO, 2, 2, FLOAT32): _sweep((256, -12.39, 3.72)),
    (DILOCO, 4, 2, FLOAT32): _sweep((256, -21.43, 1.18), (2048, -2.12, 0.25)),
    (DILOCO, 4, 4, FLOAT32): _sweep((256, -33.77, 2.39)),
    (DILOCO, 4, 1, BF16): _sweep((256, -12.39, 5.19)),
    (DILOCO, 4, 1, FLOAT32, 4): (Cost(-11.34, 3.00, 3, 256, DILOCO_SHORT),),
    (DILOCO, 3, 1, FLOAT32, 3): (Cost(-7.71, 2.35, 3, 256, DILOCO_SHORT),),  # the strategy's defaults
}


def _key(mode: Mode) -> Optional[tuple]:
    row = ROWS.get(mode.compress)
    if row is None:
        return None
    if mode.sync == DILOCO:
        if not mode.plain_averaging:
            return None
        key = (DILOCO, mode.sync_every, mode.sync_delay, row.name)
        return key if mode.fragments == 1 else key + (mode.fragments,)
    if mode.compress == POWERSGD:
        return (DDP, POWERSGD, mode.powersgd_rank)
    return (DDP, row.half or row.name)  # "bf16_hook" is "bf16": the record measured torch's bf16 hook


def is_reference(mode: Mode) -> bool:
    return _key(mode) == (DDP, FLOAT32)


def costs(mode: Mode) -> Optional[Tuple[Cost, ...]]:
    """The measured costs of `mode` (one per budget; empty for the reference), or None: not measured."""
    return COSTS.get(_key(mode))


def cost_text(mode: Mode) -> str:
    """What `mode` cost on the benchmark task, with the record to read: one clause."""
    found = costs(mode)
    if found is None:
        return f"not measured on the project's benchmark task (measured modes: {CONVERGENCE}, {DILOCO_SWEEP})"
    if not found:
        return "exact: the reference the other modes are measured against"
    budgets = ", ".join(f"{c.text() if i == 0 else c.text().removesuffix(' points')} after {c.steps} steps"
                        for i, c in enumerate(found))
    return (f"measured on {TASK}, not on your model: {budgets} of validation accuracy against float32 DDP "
            f"({found[0].seeds} seeds; {found[0].record})")


def summary_line(mode: Mode) -> str:
    """The end-of-fit summary's line: the mode and what it cost on the benchmark task."""
    return f"mccl: mode: {mode.describe()}: {cost_text(mode)}"


def powersgd_warning(rank: int) -> str:
    mode = Mode(DDP, POWERSGD, powersgd_rank=rank)
    return (f"compress='powersgd' (rank {rank}) changes the arithmetic: it sends a low-rank approximation of each "
            f"gradient, not the gradient; {cost_text(mode)}. Check your model's validation accuracy "
            f"against compress=None, or use compress='bf16' or 'int8', which kept DDP's accuracy there.")


def steps_to_reference(mode: Mode) -> Tuple[Optional[float], str]:
    """(the steps `mode` needs to reach DDP's accuracy, as a multiple of DDP's; or None) and why: for `mccl plan`'s
    time-to-accuracy estimate."""
    found = costs(mode)
    if found is None:
        return None, "not measured"
    if not found:
        return 1.0, "the reference"
    if all(c.same_curve for c in found):
        return 1.0, "its accuracy curve followed DDP's"
    last = found[-1]
    return None, f"still {last.text()} after {last.steps} steps: the steps it needs were not measured"
