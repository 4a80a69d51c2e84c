"""Pace by speed: each member's share of the global batch follows its measured samples per second.

Measuring (`Speedometer`, one per member). A step's own work is the time from `start_step()` returning to the
member's `should_commit()` call, less the time it spent waiting for the others in its collectives: from issuing
its step's last collective (DDP issues its last gradient bucket once the member's own backward pass is done) to
the completion of the latest one. A fast member that waits there for a slow one's gradients is not charged for
the wait, so the two measure different speeds. Its rate is the step's samples over that time, smoothed by an
exponential moving average (`pace_smoothing`: the weight of the newest step). The first step a member trains is
a warm-up (the loop builds DDP, torch allocates its buffers) and is not measured, nor is a step that failed or
gave the member no samples. A member posts its rate at every step boundary once it has measured
`pace_after_steps` steps; before that it posts none.

Deciding (`paced_shares`, called by the member that writes the boundary's decision). The next step's shares
are whole sample counts, one per member of the next quorum in rank order, summing to the global batch:

1. each member's weight is its posted rate; a member without one (a joiner, or one still warming up) weighs
   the median of the posted rates; when nobody has posted one, every member weighs the same;
2. each member's exact part is the global batch in proportion to the weights, but never less than the minimum
   (`pace_min_share` of an equal share, and at least one sample while the batch has one for every member, so a
   slow member goes on being measured): a member under it is held at the minimum and the others share what is
   left in proportion to their weights, until nobody is under it;
3. the exact parts become whole counts by largest remainders (each the whole part of its exact part, then one
   more each to the largest remainders, ties to the earlier member in rank order).

The shares are written in the decision, so every member deals the same counts whoever decided; they are no
part of the sampler's state, its digest or a checkpoint. The comm hook weighs each member's gradient by its
part of the global batch, so the step's gradient is the mean over the global batch whatever the shares.
"""
from __future__ import annotations

import math
import statistics
import threading
import time
from typing import Optional, Sequence, Tuple

from .sampler import largest_remainder

# A share line is printed when some member's share moved by at least this fraction of an equal share (and at
# least one sample) since the last line, or the members changed and the shares are not equal.
MATERIAL_CHANGE = 0.1


class Speedometer:
    """This member's measured rate in samples per second (module docstring); `rate` is 0.0 until it counts."""

    def __init__(self, smoothing: float, after_steps: int):
        self.smoothing = smoothing
        self.after_steps = after_steps
        self.measured = 0  # steps measured so far
        self._ema = 0.0
        self._warmed_up = False
        self._started: Optional[float] = None
        self._lock = threading.Lock()  # collectives complete on the engine's threads
        self._last_issued: Optional[float] = None
        self._last_completed: Optional[float] = None

    @property
    def rate(self) -> float:
        return self._ema if self.measured >= self.after_steps else 0.0

    def start(self) -> None:
        """The step's work begins (`start_step()` returns)."""
        with self._lock:
            self._started = time.monotonic()
            self._last_issued = self._last_completed = None

    def issued(self) -> None:
        """A collective of the step was issued."""
        with self._lock:
            self._last_issued = time.monotonic()

    def completed(self) -> None:
        """A collective of the step completed."""
        with self._lock:
            self._last_completed = time.monotonic()

    def stop(self, samples: int, ok: bool) -> None:
        """The step's work ends (`should_commit()` is called): measure it, unless it is not to be measured."""
        with self._lock:
            started, self._started = self._started, None
            elapsed = time.monotonic() - started if started is not None else 0.0
            if self._last_issued is not None and self._last_completed is not None:
                elapsed -= max(0.0, self._last_completed - self._last_issued)
        if started is None or not ok or samples == 0 or elapsed <= 0:
            return
        if not self._warmed_up:
            self._warmed_up = True
            return
        rate = samples / elapsed
        self._ema = rate if self.measured == 0 else self.smoothing * rate + (1 - self.smoothing) * self._ema
        self.measured += 1


def paced_shares(rates: Sequence[float], total: int, min_share: float) -> Tuple[int, ...]:
    """The members' whole sample counts of a batch of `total`, in proportion to `rates` (0: not measured yet),
    none under `min_share` of an equal share, summing to `total` (module docstring)."""
    if not rates:
        raise ValueError("cannot pace a batch for no members")
    if any(not (r >= 0) or math.isinf(r) for r in rates):
        raise ValueError(f"rates must be finite and non-negative (0 for a member not measured yet), got {list(rates)}")
    if not 0 < min_share < 1:
        raise ValueError(f"min_share={min_share!r} must be between 0 and 1 (a fraction of an equal share)")
    n = len(rates)
    posted = [r for r in rates if r > 0]
    median = statistics.median(posted) if posted else 1.0
    weights = [r if r > 0 else median for r in rates]
    least = max(min_share * total / n, 1.0 if total >= n else 0.0)
    held = [False] * n
    while True:
        left = total - least * sum(held)
        free = sum(w for w, h in zip(weights, held) if not h)
        exact = [least if h else left * w / free for w, h in zip(weights, held)]
        under = [i for i in range(n) if not held[i] and exact[i] < least]
        if not under:
            return tuple(largest_remainder(total, exact))
        for i in under:
            held[i] = True


def equal_shares(members: int, total: int) -> Tuple[int, ...]:
    """`total` samples dealt equally (largest remainders, ties to the earlier member)."""
    return tuple(largest_remainder(total, [total / members] * members))


def changed_materially(before: Tuple[Tuple[str, ...], Tuple[int, ...]], members: Sequence[str],
                       shares: Sequence[int]) -> bool:
    """Whether `shares` of `members` moved materially from `before` (the last line's members and shares; an
    equal split when the members differ)."""
    then_members, then_shares = before
    if tuple(members) != tuple(then_members):
        then_shares = equal_shares(len(members), sum(shares))
    equal = sum(shares) / len(shares)
    return any(abs(a - b) >= max(1.0, MATERIAL_CHANGE * equal) for a, b in zip(shares, then_shares))


__all__ = ["Speedometer", "paced_shares", "equal_shares", "changed_materially", "MATERIAL_CHANGE"]
