"""Where an mccl series' training step goes, from the engine's timeline (`lightning_mccl.timeline()`: each
collective's issue, start, ready and done times on the rank's progress thread, which runs them one at a time).

For one rank's step [t0, t1] and the collectives issued in it, in order, the step splits into:

    before first  t0 to the first collective's issue: zero_grad, forward, backward up to the first bucket
    held          issued (or the one before done, if later) to started: the engine had it and had not started
                  it (the completion order holds it until the previous future's callbacks have returned)
    staging       started to ready: waiting for the device-to-host copy of its buffers
    peers         ready to the moment the last rank was ready for it (the ranks of the stand-in share one
                  machine's clock): waiting for a peer still producing or staging its bucket
    engine        the rest of ready to done: the collective running once every rank had it
    starved       the one before done to this one's issue: nothing to run (the next bucket was not produced yet)
    after last    the last one done to t1: results back to the device, the optimizer step, synchronize

The parts add up to the step. `ring_bytes` is what the ring puts on each link for the collectives' payloads on
the wire (2(n-1)/n x wire_bytes: half the float32 bytes under MCCL_WIRE_DTYPE), so ring_bytes / goodput is the
time the link allows for peers + engine.
"""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Sequence

PARTS = ("collectives", "before_first", "held", "staging", "peers", "engine", "starved", "after_last",
         "ring_bytes")


class TimelineIncomplete(RuntimeError):
    """A rank's timeline lost collectives (MCCL_TIMELINE_ENTRIES smaller than the run needs)."""


def latest_ready(entries: Sequence[dict], max_reduce: Callable, min_reduce: Callable) -> List[int]:
    """By seq: the latest ready_ns over the ranks (max_reduce, min_reduce: in-place MAX / MIN over them).
    TimelineIncomplete on every rank when one rank's timeline does not hold every collective from seq 0 on
    (decided together, so no rank waits in a reduction the others left)."""
    import torch

    complete = torch.tensor([int(all(e["seq"] == i for i, e in enumerate(entries)))])
    min_reduce(complete)
    if not complete.item():
        raise TimelineIncomplete("the mccl timeline of a rank lost collectives: MCCL_TIMELINE_ENTRIES is smaller "
                                 "than this run needs (unset it: fleet_ddp sizes it)")
    n = torch.tensor([len(entries)])
    max_reduce(n)
    ready = torch.zeros(int(n), dtype=torch.int64)
    for e in entries:
        ready[e["seq"]] = e["ready_ns"]
    max_reduce(ready)
    return ready.tolist()


def breakdown(entries: Sequence[dict], t0_ns: int, t1_ns: int, world: int, latest: Sequence[int]) -> Dict[str, float]:
    """The parts (seconds; `collectives` a count, `ring_bytes` bytes) of the step [t0_ns, t1_ns]; `latest`
    from latest_ready()."""
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
        run = e["done_ns"] - e["ready_ns"]
        peers = min(run, max(0, latest[e["seq"]] - e["ready_ns"]))
        parts["peers"] += peers / 1e9
        parts["engine"] += (run - peers) / 1e9
        parts["ring_bytes"] += 2 * (world - 1) / world * e["wire_bytes"]
        previous_done = e["done_ns"]
    parts["after_last"] = max(0, t1_ns - previous_done) / 1e9
    return parts


def summarize(steps: List[Dict[str, float]]) -> Dict[str, float]:
    """tl_<part>: the median over the timed steps (each already the mean over the ranks)."""
    return {f"tl_{p}": statistics.median(s[p] for s in steps) for p in PARTS} if steps else {}
