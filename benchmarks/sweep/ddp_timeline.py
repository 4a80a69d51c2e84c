"""Where an mccl series' training step goes, from the engine's timeline (`lightning_mccl.timeline()`: each
collective's issue, start, ready and done times on the rank's progress thread, which runs them one at a time).

For one rank's step [t0, t1] and the collectives issued in it, in order, the step splits into:

    before first  t0 to the first collective's issue: zero_grad, forward, backward up to the first bucket
    held          issued (or the one before done, if later) to started: the engine had it and had not started
                  it (the completion order holds it until the previous future's callbacks have returned)
    staging       started to ready: waiting for the device-to-host copy of its buffers
    run           ready to done: the collective itself, waiting for slower ranks included
    starved       the one before done to this one's issue: nothing to run (the next bucket was not produced yet)
    after last    the last one done to t1: results back to the device, the optimizer step, synchronize

The parts add up to the step. `ring_bytes` is what the ring puts on each link for the bytes run (2(n-1)/n x
bytes), so ring_bytes / goodput is the run time the link allows.
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Sequence

PARTS = ("collectives", "before_first", "held", "staging", "run", "starved", "after_last", "ring_bytes")


def breakdown(entries: Sequence[dict], t0_ns: int, t1_ns: int, world: int) -> Dict[str, float]:
    """The parts (seconds; `collectives` a count, `ring_bytes` bytes) of the step [t0_ns, t1_ns]."""
    ops = sorted((e for e in entries if t0_ns <= e["issued_ns"] <= t1_ns), key=lambda e: e["started_ns"])
    parts = dict.fromkeys(PARTS, 0.0)
    parts["collectives"] = float(len(ops))
    if not ops:
        parts["before_first"] = (t1_ns - t0_ns) / 1e9
        return parts
    parts["before_first"] = (ops[0]["issued_ns"] - t0_ns) / 1e9
    previous_done = ops[0]["issued_ns"]
    for e in ops:
        parts["starved"] += max(0, e["issued_ns"] - previous_done) / 1e9
        parts["held"] += max(0, e["started_ns"] - max(e["issued_ns"], previous_done)) / 1e9
        parts["staging"] += (e["ready_ns"] - e["started_ns"]) / 1e9
        parts["run"] += (e["done_ns"] - e["ready_ns"]) / 1e9
        parts["ring_bytes"] += 2 * (world - 1) / world * e["bytes"]
        previous_done = e["done_ns"]
    parts["after_last"] = max(0, t1_ns - previous_done) / 1e9
    return parts


def summarize(steps: List[Dict[str, float]]) -> Dict[str, float]:
    """tl_<part>: the median over the timed steps (each already the mean over the ranks)."""
    return {f"tl_{p}": statistics.median(s[p] for s in steps) for p in PARTS} if steps else {}
