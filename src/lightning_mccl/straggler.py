"""Stragglers: which rank holds the fleet back, by how much, and what batch sizes would even it out.

`CommMetrics` (lightning/comm_metrics.py) gathers one `RankWindow` per rank every N steps (one small allgather) and
feeds them to a `StragglerReport`:

- a rank whose compute time per step (its step time minus the time it waited for communication) is more
  than `threshold` above the median rank's in `patience` windows in a row is a straggler: one warning names
  its host, the factor (its compute time over the median's) and the likely causes on a Mac (`SLOW_CAUSES`);
- at the end of fit, `host_table()` gives per host the median compute and wait time per step and the
  samples/s of its ranks together, and `format_table()` prints it.

For a fleet of unequal Macs, `propose_batch_sizes()` splits a global batch in proportion to each host's
samples per second of compute, so that every host's compute takes about as long; nothing applies it by
itself (after a straggler warning, the end-of-fit summary prints its proposal, `StragglerReport.proposal()`). A rank then
trains on its own share of the global batch, and `scale_loss()` weights its mean loss by that share, so that
DDP's average of the ranks' gradients is the gradient of the mean loss over the global batch, as with equal
batches.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from .accuracy_costs import Mode, summary_line as mode_line

# $MCCL_SUMMARY_MARKER set (by `mccl launch`): CommMetrics on rank 0 also prints its end-of-fit summary record
# as one line "<marker> <json>", which the launcher takes out of the output and prints with summary_text()
# once every rank has ended.
SUMMARY_MARKER_ENV = "MCCL_SUMMARY_MARKER"
DEFAULT_THRESHOLD = 0.2  # slower than the median by more than 20 %
DEFAULT_PATIENCE = 3  # windows in a row
# Why one Mac of a fleet computes slower than the others, the usual causes first. `mccl doctor --model M --batch B`
# times each Mac's step and looks for each of these on a slow one (lightning_mccl/launcher/fleet_checks.py); a
# straggler warning names them all.
SLOW_CAUSES = {
    "low_power": "Low Power Mode",
    "battery": "Automatic power mode on battery",
    "thermal": "a thermal limit",
    "gpu_busy": "another program on the GPU",
    "chip": "an older or smaller chip",
}


def slow_causes_text() -> str:
    """The likely causes of a slow Mac, as a straggler warning names them."""
    return (f"Likely causes on a Mac: {', '.join(SLOW_CAUSES.values())}; `mccl doctor --model M --batch B` times "
            f"each Mac's step and names which.")


@dataclass(frozen=True)
class RankWindow:
    """One rank over one window of steps: means per step, in seconds."""

    rank: int
    host: str
    step_s: float
    compute_s: float
    wait_s: float
    samples_per_s: float


@dataclass
class StragglerReport:
    threshold: float = DEFAULT_THRESHOLD
    patience: int = DEFAULT_PATIENCE
    steps_per_window: int = 1
    windows: List[List[RankWindow]] = field(default_factory=list)
    _streak: Dict[int, int] = field(default_factory=dict)
    _warned: set = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.threshold <= 0:
            raise ValueError(f"straggler threshold must be > 0 (a fraction above the median), got {self.threshold}")
        if self.patience < 1:
            raise ValueError(f"straggler patience must be at least 1 window, got {self.patience}")

    def add(self, window: Sequence[RankWindow]) -> List[str]:
        """Records one window (every rank's numbers); returns the warnings it triggers (each rank warned once)."""
        window = list(window)
        self.windows.append(window)
        median = statistics.median(w.compute_s for w in window)
        messages = []
        for w in window:
            slow = median > 0 and w.compute_s > median * (1 + self.threshold)
            self._streak[w.rank] = self._streak.get(w.rank, 0) + 1 if slow else 0
            if self._streak[w.rank] >= self.patience and w.rank not in self._warned:
                self._warned.add(w.rank)
                messages.append(self._message(w))
        return messages

    def _message(self, w: RankWindow) -> str:
        recent = self.windows[-self.patience:]
        mine = statistics.median(r.compute_s for win in recent for r in win if r.rank == w.rank)
        median = statistics.median(statistics.median(r.compute_s for r in win) for win in recent)
        steps = self.patience * self.steps_per_window
        return (f"mccl: straggler: host {w.host} (rank {w.rank}) computes {mine / median:.2f}x as long per step as"
                f" the median rank ({mine:.3f} s vs {median:.3f} s, over the last {steps} steps); every other rank"
                f" waits for it. {slow_causes_text()} On a mixed fleet, give it a smaller batch"
                f" (lightning_mccl.straggler.propose_batch_sizes).")

    def slowest_rank(self) -> Optional[dict]:
        """The rank with the highest median compute time per step, with its factor over the median rank's."""
        per_rank: Dict[int, List[RankWindow]] = {}
        for window in self.windows:
            for w in window:
                per_rank.setdefault(w.rank, []).append(w)
        if len(per_rank) < 2:
            return None
        medians = {r: statistics.median(w.compute_s for w in ws) for r, ws in per_rank.items()}
        rank = max(medians, key=medians.get)
        middle = statistics.median(medians.values())
        return {"rank": rank, "host": per_rank[rank][0].host, "compute_s": medians[rank],
                "factor": medians[rank] / middle if middle > 0 else 1.0}

    def proposal(self) -> Optional[Dict[str, int]]:
        """After a straggler warning: propose_batch_sizes() for the fleet's current global batch (every rank's
        samples per step) in proportion to each host's samples per second of *compute* (a rank's batch over its
        compute time: step times are equal in DDP, where everyone waits for the slowest); None while no rank
        was reported."""
        if not self._warned or not self.windows:
            return None
        batches: Dict[int, List[float]] = {}
        computes: Dict[int, List[float]] = {}
        hosts: Dict[int, str] = {}
        for window in self.windows:
            for w in window:
                batches.setdefault(w.rank, []).append(w.samples_per_s * w.step_s)
                computes.setdefault(w.rank, []).append(w.compute_s)
                hosts[w.rank] = w.host
        rates: Dict[str, float] = {}
        for rank, host in hosts.items():
            compute = statistics.median(computes[rank])
            rates[host] = rates.get(host, 0.0) + (statistics.median(batches[rank]) / compute if compute > 0 else 0.0)
        global_batch = round(sum(statistics.median(b) for b in batches.values()))
        if len(rates) < 2 or global_batch < len(rates) or not all(rate > 0 for rate in rates.values()):
            return None  # one host: nothing to move between hosts
        return propose_batch_sizes(rates, global_batch)

    def host_table(self) -> List[dict]:
        """Per host, in order of first rank: median compute and wait per step (over its ranks and the windows),
        and samples/s (the medians of its ranks, summed)."""
        by_host: Dict[str, List[RankWindow]] = {}
        for window in self.windows:
            for w in window:
                by_host.setdefault(w.host, []).append(w)
        rows = []
        for host, items in by_host.items():
            ranks = sorted({w.rank for w in items})
            rows.append({
                "host": host,
                "ranks": ranks,
                "compute_s": statistics.median(w.compute_s for w in items),
                "wait_s": statistics.median(w.wait_s for w in items),
                "samples_per_s": sum(statistics.median(w.samples_per_s for w in items if w.rank == r) for r in ranks),
            })
        return rows


def format_table(rows: Sequence[Mapping]) -> str:
    """host_table() as aligned text."""
    header = ("host", "ranks", "compute/step", "wait/step", "samples/s")
    lines = [header] + [
        (r["host"], ",".join(str(x) for x in r["ranks"]), f"{r['compute_s'] * 1e3:.1f} ms", f"{r['wait_s'] * 1e3:.1f} ms",
         f"{r['samples_per_s']:.1f}")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
                     for line in lines)


def propose_batch_sizes(samples_per_s: Mapping[str, float], global_batch: int, minimum: int = 1) -> Dict[str, int]:
    """Per-host batch sizes summing to `global_batch`, proportional to each host's measured samples/s (largest
    remainder rounding), at least `minimum` each: with them every host's compute per step takes about as long.

    samples_per_s: per host, samples per second of compute (see StragglerReport.proposal). Raises ValueError for a non-positive rate or a global batch too small for the minimum."""
    if not samples_per_s:
        raise ValueError("propose_batch_sizes: no hosts given")
    for host, rate in samples_per_s.items():
        if not rate > 0:
            raise ValueError(f"propose_batch_sizes: host {host!r} has samples/s {rate!r}; every rate must be > 0")
    if global_batch < minimum * len(samples_per_s):
        raise ValueError(f"propose_batch_sizes: a global batch of {global_batch} cannot give {len(samples_per_s)}"
                         f" hosts at least {minimum} samples each")
    spare = global_batch - minimum * len(samples_per_s)
    total = sum(samples_per_s.values())
    exact = {h: spare * rate / total for h, rate in samples_per_s.items()}
    sizes = {h: minimum + int(x) for h, x in exact.items()}
    left = global_batch - sum(sizes.values())
    for h in sorted(exact, key=lambda h: exact[h] - int(exact[h]), reverse=True)[:left]:
        sizes[h] += 1
    return sizes


def scale_loss(loss, local_count: int, global_count: int, world_size: int):
    """`loss` (the mean over this rank's `local_count` samples) weighted so that DDP's gradient average over
    `world_size` ranks equals the gradient of the mean loss over all `global_count` samples."""
    if local_count < 0 or global_count <= 0 or world_size <= 0:
        raise ValueError(f"scale_loss: need local_count >= 0, global_count > 0 and world_size > 0, got"
                         f" {local_count}, {global_count}, {world_size}")
    return loss * (local_count * world_size / global_count)


def summary_line(record: dict) -> str:
    """One line: rank 0's communication share of its step time (in flight, and exposed), goodput, bytes per
    step, and the slowest rank with its factor over the median rank's compute time."""
    m = record["metrics"]
    share = m["time_per_step_s"] / m["step_time_s"] if m["step_time_s"] > 0 else 0.0
    line = (f"mccl: communication {min(1.0, share):.0%} of step time ({m['exposed_fraction']:.0%} exposed),"
            f" goodput {m['wire_goodput_gbps']:.2f} Gb/s, {m['bytes_per_step'] / 1e6:.2f} MB/step per rank,"
            f" {record['world_size']} ranks")
    slowest = record.get("slowest")
    if slowest:
        line += (f"; slowest: rank {slowest['rank']} on {slowest['host']}"
                 f" ({slowest['factor']:.2f}x the median compute)")
    return line


def summary_text(record: dict) -> str:
    """The end-of-fit summary: the host table, summary_line(), the mode's line when the record names one
    (accuracy_costs.summary_line) and the proposal after a straggler warning."""
    text = format_table(record["hosts"]) + "\n" + summary_line(record)
    if record.get("mode"):
        text += "\n" + mode_line(Mode(**record["mode"]))
    if record.get("proposal"):
        sizes = ", ".join(f"{host}: {size}" for host, size in record["proposal"].items())
        text += (f"\nmccl: batch sizes per host that would equalise step time, same global batch: {sizes}"
                 " (split a host's share between its ranks; scale each rank's loss with straggler.scale_loss)")
    return text
