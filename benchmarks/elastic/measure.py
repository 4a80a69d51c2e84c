"""What the churn benchmark's cases measure, from the members' records (member.py): the ledger check,
throughput over the hosts present, steady-state step time, joiners' heal time, the members' own rates."""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional

import numpy as np

WARMUP_STEPS = 2  # host 0's first steps (DDP built, buffers allocated) are left out of every rate


def ledger_check(host0: dict, num_samples: int, epochs: int) -> str:
    """"ok" when every epoch finished and each id of it was trained exactly once (the committed steps' ids, and
    the sampler's ledger where the member is elastic); else what is wrong."""
    rows = [r for r in host0["steps"] if r["committed"]]
    for epoch in range(epochs):
        ids = [i for r in rows if r["epoch"] == epoch for i in r["ids"]]
        counts = np.bincount(np.asarray(ids, dtype=np.int64), minlength=num_samples)
        full = len(ids) == num_samples or not host0["ledgers"]  # plain DDP drops the last partial batch
        if not full or counts.max(initial=0) > 1:
            return f"epoch {epoch}: {int((counts == 0).sum())} ids never trained, {int((counts > 1).sum())} repeated"
        ledger = host0["ledgers"].get(str(epoch))
        if host0["ledgers"] and (ledger is None or min(ledger) < 0):
            return f"epoch {epoch}: the sampler's ledger is missing or incomplete"
    return "ok"


def window(host0: dict) -> List[dict]:
    return host0["steps"][WARMUP_STEPS:]


def throughput(host0: dict) -> Dict[str, float]:
    """Samples/s of the committed steps after the warm-up, the time-weighted mean number of members, and the
    samples/s per member present."""
    rows = window(host0)
    t0, t1 = host0["steps"][WARMUP_STEPS - 1]["end"], rows[-1]["end"]
    samples = sum(len(r["ids"]) for r in rows if r["committed"])
    previous = t0
    weighted = 0.0
    for r in rows:
        weighted += (r["end"] - previous) * r["size"]
        previous = r["end"]
    members = weighted / (t1 - t0)
    return {"samples_per_s": samples / (t1 - t0), "mean_members": members,
            "per_member": samples / (t1 - t0) / members, "seconds": t1 - t0}


def step_time(host0: dict) -> float:
    """The median time from one step's start to the next's (the boundary included)."""
    starts = [r["start"] for r in window(host0)]
    return statistics.median(np.diff(starts)) if len(starts) > 1 else float("nan")


def heals(records: Dict[str, dict]) -> List[Dict[str, float]]:
    """Each joiner's heal: from the boundary that admitted it (host 0's member read that decision) to the start of
    its first step, with the state's bytes."""
    steps = records["m0"]["steps"]
    out = []
    for name, r in records.items():
        if not name.startswith("j") or "first_step" not in r:
            continue
        admitted = next((s["end"] for s in steps if name in s["members"]), None)
        if admitted is not None:
            out.append({"member": name, "heal_s": r["first_step"] - admitted, "state_bytes": r.get("state_bytes", 0)})
    return out


def own_rates(records: Dict[str, dict]) -> Dict[str, float]:
    """Each member's own samples/s as its manager measured it (its step's work, waits for the others left out)."""
    return {n: r["rate"] for n, r in records.items() if r.get("rate")}


def series(host0: dict, smooth: int = 5) -> Dict[str, tuple]:
    """Seconds since the warm-up's end against the committed samples/s (over the last `smooth` steps), and against
    the members."""
    rows = window(host0)
    t0 = host0["steps"][WARMUP_STEPS - 1]["end"]
    ends = [t0] + [r["end"] for r in rows]
    done = np.cumsum([0] + [len(r["ids"]) if r["committed"] else 0 for r in rows])
    xs, rates, sizes = [], [], []
    for i, r in enumerate(rows, start=1):
        j = max(0, i - smooth)
        xs.append(r["end"] - t0)
        rates.append((done[i] - done[j]) / (ends[i] - ends[j]))
        sizes.append(len(r["members"]))
    return {"samples": (xs, rates), "members": (xs, sizes)}


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None
