"""Step times on the 8-host fleet stand-in, to turn a method's training steps into projected wall time.

The defaults are issue 27's measurement (`benchmarks/fleet_ddp.py --hosts 8 --rate 10gbit --device cuda`,
ViT-B/16 in float32, batch 8 per rank, TCP cubic, median step). `--step-times FILE` replaces them with the
results.csv of a fleet_ddp.py run (its columns `series`, `world`, `batch_per_rank`, `time_median_s`): each
method reads the first of its `fleet_series` labels the file has (accuracy/methods.py), or the label that
`--step-series METHOD=LABEL` names. A method with no measured step is "unknown" and gets no wall-time points.
The projection is steps x that step time: the stand-in's step, not this benchmark's model
(benchmarks/record/convergence.md).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from .methods import Method

ISSUE = "issue 27 (fleet_ddp.py, 8 hosts, 10 Gbit/s, ViT-B/16 fp32, batch 8, median)"
DEFAULT_MS = {"ddp-fp32": 622.0, "bf16-hook": 393.0, "powersgd-r1": 294.0, "powersgd-r4": 335.0}
COMPUTE = "compute"  # fleet_ddp.py's series without communication
DEFAULT_COMPUTE_MS = 251.0


@dataclass(frozen=True)
class StepTime:
    ms: Optional[float]  # None: unknown
    source: str


def read_fleet_csv(path: str, world: int, batch: int) -> Dict[str, float]:
    """{series label: median step in ms} of a fleet_ddp.py results.csv, the rows at `world` ranks and `batch`
    per rank. ValueError naming the file and what it holds when it has no such rows or lacks the columns."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    need = {"series", "world", "batch_per_rank", "time_median_s"}
    if not rows or not need <= set(rows[0]):
        raise ValueError(f"--step-times {path}: not a fleet_ddp.py results.csv (needs the columns "
                         f"{', '.join(sorted(need))})")
    out = {r["series"]: 1e3 * float(r["time_median_s"]) for r in rows
           if r["time_median_s"] and int(r["world"]) == world and int(r["batch_per_rank"]) == batch}
    if not out:
        have = sorted({(int(r["world"]), int(r["batch_per_rank"])) for r in rows})
        raise ValueError(f"--step-times {path}: no rows at {world} ranks and batch {batch} (it has "
                         f"{', '.join(f'{w} ranks x batch {b}' for w, b in have)}; see --step-world/--step-batch)")
    return out


def resolve(methods: Sequence[Method], files: Sequence[str], mapping: Sequence[str], world: int = 8,
            batch: int = 8) -> Dict[str, StepTime]:
    """Each method's step time, and the compute-only step's under COMPUTE: from `files` (later files override
    earlier ones) where they have the method's series, else the issue's figure, else unknown. `mapping`:
    METHOD=LABEL items; ValueError for an unknown method or a label no file has."""
    labels = {m.name: list(m.fleet_series) for m in methods}
    labels[COMPUTE] = [COMPUTE]
    mapped = set()
    for item in mapping:
        name, sep, label = item.partition("=")
        if not sep or name not in labels or not label:
            raise ValueError(f"--step-series {item!r}: write METHOD=SERIES with METHOD one of "
                             f"{', '.join(n for n in labels if n != COMPUTE)}")
        labels[name] = [label]
        mapped.add(name)
    measured: Dict[str, tuple] = {}
    for path in files:
        for series, ms in read_fleet_csv(path, world, batch).items():
            measured[series] = (ms, f"{path}: {series}")
    out: Dict[str, StepTime] = {}
    for name, candidates in labels.items():
        hit = next((measured[c] for c in candidates if c in measured), None)
        if hit is None and name in mapped and files:
            raise ValueError(f"--step-series {name}={candidates[0]}: no such series at {world} ranks and batch "
                             f"{batch} in {', '.join(files)} (it has {', '.join(sorted(measured))})")
        if hit is not None:
            out[name] = StepTime(*hit)
        elif name == COMPUTE:
            out[name] = StepTime(DEFAULT_COMPUTE_MS, ISSUE)
        elif name in DEFAULT_MS:
            out[name] = StepTime(DEFAULT_MS[name], ISSUE)
        else:
            out[name] = StepTime(None, "unknown: not measured yet (--step-times a fleet_ddp.py results.csv with it)")
    return out


def projected_s(step: int, t: StepTime) -> Optional[float]:
    """Wall time of `step` training steps at the stand-in's step time; None when unknown."""
    return None if t.ms is None else step * t.ms / 1e3


def sources(times: Dict[str, StepTime]) -> List[str]:
    return list(dict.fromkeys(t.source for t in times.values()))
