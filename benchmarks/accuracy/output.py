"""What benchmarks/convergence.py leaves behind: curves.csv (every validation point of every method and seed),
summary.csv (a row per method), results.md (the machine, the command, the summary table and the curves),
results.png (validation accuracy against samples and against the stand-in's projected wall time), and the
summary table on stdout."""
from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence

from sweep import report

from . import summary
from .methods import REFERENCE
from .step_times import COMPUTE, StepTime, projected_s
from .summary import Outcome, Stats

STATUS_CELL = 90  # characters of an unavailable/failed method's error shown in the table (all of it in the CSV)

NOTES = [
    "final val acc: after the whole budget, each rank's model on the whole validation set, the mean over ranks "
    "(ranks end equal: the same weights on every rank, bit for bit); mean ± sample sd over the seeds.",
    f"vs {REFERENCE}: mean over seeds of (method - reference) in points, paired by seed (same initial model and "
    "data order); ± twice its standard error. within seed noise: |difference| <= that. target: issue 27's "
    "(int8 at most 0.5 points below, DiLoCo 1 point), met when the whole interval is above it.",
    "stand-in step: the 8-host fleet stand-in's median step (ViT-B/16, batch 8 per rank, 10 Gbit/s) for this "
    "method; projected time = this run's optimizer steps x that step: what the budget would take on the fleet, "
    "not on this machine. Every method ran the same number of steps (its own warm-up and cosine over them): a "
    "curve's early points are not what a run budgeted for that time would reach.",
]


def _pct(x) -> str:
    return f"{100 * x:.2f}"


def _status_cell(status: str) -> str:
    text = status.replace("|", "/").replace("\n", " ")
    return text if len(text) <= STATUS_CELL else text[:STATUS_CELL - 3] + "..."


def table(outcomes: Sequence[Outcome], st: Dict[str, Stats], times: Dict[str, StepTime], steps: int
          ) -> report.Table:
    cols = ["method", "status", "seeds", "final val acc %", f"vs {REFERENCE} (pts)", "within seed noise",
            "target", "val loss", "ranks end equal", "stand-in step ms", "projected time s"]
    cells = []
    for o in outcomes:
        t = times.get(o.method.name, StepTime(None, ""))
        step_ms = f"{t.ms:.0f}" if t.ms is not None else "unknown"
        total = projected_s(steps, t)
        s = st.get(o.method.name)
        if s is None:
            cells.append([o.method.name, _status_cell(o.status)] + [""] * 7 + [step_ms, ""])
            continue
        acc = _pct(s.mean) + (f" ± {100 * s.sd:.2f}" if s.sd is not None else "")
        delta = "ref" if o.method.name == REFERENCE else (
            "" if s.delta_pts is None else f"{s.delta_pts:+.2f}" + (f" ± {s.noise_pts:.2f}" if s.noise_pts else ""))
        same = "yes" if s.same_weights else f"no (acc spread {100 * s.rank_spread:.2f} pts)"
        cells.append([o.method.name, o.status, str(len(s.seeds)), acc, delta, summary.within_noise(s),
                      s.verdict if o.method.name != REFERENCE else "", f"{sum(s.losses) / len(s.losses):.3f}",
                      same, step_ms, f"{total:.0f}" if total is not None else "unknown"])
    return cols, cells


def curve_rows(outcomes: Sequence[Outcome], times: Dict[str, StepTime]) -> List[dict]:
    rows = []
    for o in outcomes:
        t = times.get(o.method.name, StepTime(None, ""))
        for seed, runs in sorted(o.runs.items()):
            for p in runs[0]["curve"]:
                total = projected_s(p["step"], t)
                rows.append({"method": o.method.name, "seed": seed, **p,
                             "stand_in_step_ms": "" if t.ms is None else t.ms,
                             "projected_s": "" if total is None else total})
    return rows


def summary_rows(outcomes: Sequence[Outcome], st: Dict[str, Stats], times: Dict[str, StepTime], steps: int
                 ) -> List[dict]:
    rows = []
    for o in outcomes:
        t = times.get(o.method.name, StepTime(None, ""))
        s = st.get(o.method.name)
        total = projected_s(steps, t)
        row = {"method": o.method.name, "strategy_kwargs": json.dumps(o.method.strategy), "status": o.status,
               "steps": steps, "stand_in_step_ms": "" if t.ms is None else t.ms, "step_time_source": t.source,
               "projected_total_s": "" if total is None else total, "max_loss_pts": o.method.max_loss_pts or ""}
        if s is not None:
            row.update(seeds=" ".join(map(str, s.seeds)), final_acc_mean=s.mean,
                       final_acc_sd="" if s.sd is None else s.sd,
                       final_acc_by_seed=" ".join(f"{a:.4f}" for a in s.finals),
                       final_loss_mean=sum(s.losses) / len(s.losses),
                       delta_pts="" if s.delta_pts is None else s.delta_pts,
                       noise_pts="" if s.noise_pts is None else s.noise_pts, within_noise=summary.within_noise(s),
                       verdict=s.verdict, ranks_same_weights="yes" if s.same_weights else "no",
                       rank_acc_spread=s.rank_spread, fit_s_here=s.fit_s)
        rows.append(row)
    return rows


def curves_table(outcomes: Sequence[Outcome]) -> report.Table:
    """Validation accuracy (mean over seeds) at every point: a row per point, a column per method."""
    ran = [o for o in outcomes if o.ok and o.runs]
    curves = {o.method.name: summary.mean_curve(o) for o in ran}
    first = next(iter(curves.values()), [])
    cols = ["step", "samples"] + [o.method.name for o in ran]
    cells = [[str(p["step"]), str(p["samples"])] + [_pct(curves[o.method.name][i]["val_acc"]) for o in ran]
             for i, p in enumerate(first)]
    return cols, cells


def write(out: str, outcomes: Sequence[Outcome], times: Dict[str, StepTime], steps: int, header: Dict[str, str],
          log, of: str = "", quiet: bool = False) -> None:
    """`of`: what the steps were, in the title (" of fine-tuning")."""
    st = summary.compare(outcomes)
    report.write_csv(os.path.join(out, "curves.csv"), curve_rows(outcomes, times) or [{"method": ""}])
    report.write_csv(os.path.join(out, "summary.csv"), summary_rows(outcomes, st, times, steps))
    main = table(outcomes, st, times, steps)
    curves = curves_table(outcomes)
    title = f"Validation accuracy after {steps} steps{of}, every method"
    compute = times.get(COMPUTE)
    notes = NOTES + ([f"compute-only step on the stand-in: {compute.ms:.0f} ms ({compute.source})."]
                     if compute and compute.ms else [])
    notes += [f"{o.method.name}: a control, not a way to send gradients: {REFERENCE} from random weights instead of "
              f"the pretrained model (what the same steps reach without pretraining)."
              for o in outcomes if o.method.random_init]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report.markdown(title, header, main, notes))
        f.write("\n## Validation accuracy (%) against samples, mean over seeds\n\n" + report.markdown_table(curves))
    why = report.plot(os.path.join(out, "results.png"), f"{title}: {header['where']}", _panels(outcomes, st, times))
    if quiet:
        return
    if why:
        log(why)
    report.print_table(title, main, notes)
    log(f"wrote {out}/results.md, summary.csv, curves.csv{'' if why else ', results.png'}")


def _panels(outcomes: Sequence[Outcome], st: Dict[str, Stats], times: Dict[str, StepTime]) -> List[dict]:
    by_samples, by_time = {}, {}
    for o in outcomes:
        curve = summary.mean_curve(o) if o.ok else []
        if not curve:
            continue
        by_samples[o.method.name] = ([p["samples"] for p in curve], [100 * p["val_acc"] for p in curve])
        t = times.get(o.method.name)
        if t is not None and t.ms is not None:
            by_time[o.method.name] = ([projected_s(p["step"], t) for p in curve], [100 * p["val_acc"] for p in curve])
    ref = st.get(REFERENCE)
    # the two targets' lines lie 0.5 points apart: one label, under both
    lines = [(100 * ref.mean - 0.5, ""),
             (100 * ref.mean - 1.0, f"{REFERENCE} - 0.5 and - 1 pt: int8's and DiLoCo's targets")] if ref else []
    return [{"xlabel": "training samples (all ranks)", "ylabel": "validation accuracy % (mean over seeds)",
             "series": by_samples, "hlines": lines},
            {"xlabel": "projected wall time on the 8-host stand-in (s)", "ylabel": "validation accuracy %",
             "series": by_time, "hlines": lines}]
