"""What `mccl plan` writes: the table on stdout, plan.csv (a row per method and fleet size), plan.md (the
key, the table and the assumptions) and plan.png (step time, samples/s, efficiency and speed-up against hosts).
`unit` is what one host is called: "Mac" for a profile measured on a Mac's GPU, else "host"."""
from __future__ import annotations

import csv
import os
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence

from ..tables import markdown_table
from .predict import Prediction

PANELS = (("step_s", "step ms", 1e3), ("samples_per_s", "samples/s", 1.0), ("efficiency", "efficiency", 1.0),
          ("speedup", "speed-up over one {unit}", 1.0))


def cell_key(unit: str) -> str:
    return f"each cell: step ms, samples/s, efficiency, speed-up over one {unit}"


def csv_rows(predictions: Sequence[Prediction], context: Dict[str, object]) -> List[dict]:
    return [{**asdict(p), **context} for p in predictions]


def write_csv(path: str, rows: Sequence[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        w.writeheader()
        w.writerows(rows)


def table(predictions: Sequence[Prediction], more: Sequence[Sequence[str]] = ()):
    """(columns, rows): a row per fleet size, a cell per method: step ms, samples/s, efficiency, speed-up; then
    the rows `more` (a title, a cell per method)."""
    methods = list(dict.fromkeys(p.method for p in predictions))
    by = {(p.hosts, p.method): p for p in predictions}
    hosts = sorted({p.hosts for p in predictions})
    cols = ["hosts"] + methods
    cells = [[str(n)] + [_cell(by[n, m]) for m in methods] for n in hosts]
    return cols, cells + [list(r) for r in more]


def _cell(p: Prediction) -> str:
    return f"{p.step_s * 1e3:.0f}, {p.samples_per_s:.1f}, {p.efficiency:.2f}, {p.speedup:.1f}x"


def markdown(title: str, key: Sequence[str], assumptions: Sequence[str], tbl) -> str:
    return ("\n".join([f"# {title}", ""] + [f"- {k}" for k in key] + ["", ""]) + markdown_table(tbl)
            + "\n".join(["", "Assumptions:", ""] + [f"- {a}" for a in assumptions]) + "\n")


def plot(path: str, title: str, predictions: Sequence[Prediction], unit: str) -> Optional[str]:
    """plan.png; None, or why there is none (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot"
    methods = list(dict.fromkeys(p.method for p in predictions))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (key, label, scale) in zip(axes.flat, PANELS):
        for m in methods:
            pts = sorted((p.hosts, getattr(p, key) * scale) for p in predictions if p.method == m)
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=m)
        if key == "speedup":
            top = max(p.hosts for p in predictions)
            ax.plot([1, top], [1, top], color="grey", linestyle="--", linewidth=1, label="ideal")
        ax.set_xlabel("hosts")
        ax.set_ylabel(label.format(unit=unit))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write(out: str, title: str, key: Sequence[str], assumptions: Sequence[str], predictions: Sequence[Prediction],
          more: Sequence[Sequence[str]], context: Dict[str, object], unit: str) -> Optional[str]:
    """plan.csv, plan.md, plan.png in `out`; returns why there is no plot, or None."""
    os.makedirs(out, exist_ok=True)
    write_csv(os.path.join(out, "plan.csv"), csv_rows(predictions, context))
    with open(os.path.join(out, "plan.md"), "w") as f:
        f.write(markdown(title, key, assumptions, table(predictions, more)))
    return plot(os.path.join(out, "plan.png"), title, predictions, unit)
