"""What a benchmark leaves behind: results.csv (one row per measurement), results.md (the machine, the
command and the table), results.png (the plots), and the table on stdout."""
from __future__ import annotations

import csv
import os
import platform
import shlex
import sys
import time
from typing import Dict, List, Optional, Sequence

from lightning_mccl.tables import Table, markdown_table, print_table  # noqa: F401 (this module's API)


def default_out_dir(name: str) -> str:
    return os.path.join("runs", "bench", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def machine_header(argv: Sequence[str], where: str, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    import torch

    header = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": shlex.join([os.path.relpath(sys.argv[0]) if sys.argv else "python"] + list(argv)),
        "where": where,
        "machine": f"{platform.node()}, {platform.machine()}, {os.cpu_count()} CPUs, "
                   f"{platform.system()} {platform.release()}",
        "cpu": _cpu_model(),
        "python / torch": f"{platform.python_version()} / {torch.__version__}",
    }
    try:
        load = os.getloadavg()
        header["load average at start"] = " ".join(f"{x:.2f}" for x in load)
    except OSError:
        pass
    header.update(extra or {})
    return header


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_csv(path: str, rows: Sequence[dict]) -> None:
    columns: List[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def markdown(title: str, header: Dict[str, str], table: Table, notes: Sequence[str] = ()) -> str:
    lines = [f"# {title}", ""]
    lines += [f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in header.items()]
    return "\n".join(lines) + "\n\n" + markdown_table(table, notes)


def plot(path: str, title: str, panels: Sequence[dict]) -> Optional[str]:
    """panels: {"ylabel", "xlabel", "logx", "logy", "series": {label: (xs, ys)}, "xticks": (values, labels)}.
    Returns None, or why no plot was made (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib, or the package's [bench] extra): no plot"
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, p in zip(axes[0], panels):
        for label, (xs, ys) in p["series"].items():
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
        if p.get("logx"):
            ax.set_xscale("log", base=2)
        if p.get("logy"):
            ax.set_yscale("log")
        if p.get("xticks"):
            ax.set_xticks(p["xticks"][0])
            rotate = 45 if p.get("logx") else 0
            ax.set_xticklabels(p["xticks"][1], rotation=rotate, ha="right" if rotate else "center", fontsize=8)
        for y, label in p.get("hlines", ()):
            ax.axhline(y, color="grey", linestyle="--", linewidth=1)
            ax.annotate(label, (0.01, y), xycoords=("axes fraction", "data"), fontsize=8, color="grey",
                        va="bottom")
        ax.set_xlabel(p.get("xlabel", ""))
        ax.set_ylabel(p.get("ylabel", ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def human_size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{int(nbytes)} B"
