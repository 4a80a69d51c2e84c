"""DiLoCo's schedule: which parameters sync together, when each of their syncs starts, and when its outer step
applies (outer.py runs it; no tensors here).

**Rounds.** Training is a sequence of rounds; a round of length H is H inner optimizer steps, and every
trainable parameter syncs once in it. The first `warm_start` inner steps are rounds of one step whose outer
step applies at once (a delay of 0), so that training starts synchronous: every step, each rank's progress is
averaged before the next step begins (with plain averaging and plain SGD that is synchronous DDP's step; with
Adam each rank keeps its own moments). Then every round is `sync_every` steps long and its outer steps apply
`sync_delay` (tau) steps after their syncs start. With the H schedule (`qsr_alpha`, QSR: Gu et al., arXiv
2310.14423) a round's length is decided when it begins, from the inner optimizer's learning rate then (its
first parameter group's): sync_every while the learning rate is at or above the highest it has been (its
warm-up, or a constant rate), then max(sync_every, floor((alpha / lr)^2)), at most `max_sync_every`: H grows
as the learning rate falls. Every rank must decide the same H; outer.py checks that they did.

**Fragments** (Streaming DiLoCo: Douillard et al., arXiv 2501.18512). The trainable parameters, in the order
of the model's, are cut into F contiguous parts of about equal size (`fragment_bounds`; F = min(sync_every, the
parameter tensors) unless given: settings.resolve_fragments), each synced and moved by its own outer step on its
own step of the round: in a round that begins after inner step s and is H steps long, fragment f starts its sync
after step s + ceil((f + 1) H / F), so the last one syncs at the round's end (with F = 1, the whole model at the
round's end), and with F <= H each step starts at most one. Each sync then carries about 1/F of the model and
has tau steps of compute to hide behind, and a fragment's part of the anchor moves only at its own outer step.
The floating-point buffers travel with the last fragment. When a shorter round (the H schedule) brings a
fragment's next sync closer than tau, its outer step applies just before that sync starts.

**One inner step** t runs, in this order: the outer steps due at t (`due`: started before t; so with tau = H a
fragment's outer step applies before its next sync starts), the syncs that start at t (`starting`), the outer
steps due at once (the warm start's), and, when the round ends at t, the plan of the next one (`begin`). All of
it depends only on t, the settings and the learning rates read at round starts, so the anchor moves at the
same steps on every rank, and in a run resumed from `state_dict()`.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

SETTINGS = ("sync_every", "sync_delay", "warm_start", "fragments", "qsr_alpha", "max_sync_every")


def fragment_bounds(sizes: Sequence[int], fragments: int) -> List[int]:
    """Where F contiguous parts of tensors of `sizes` begin and end: indices 0 = b_0 < b_1 < ... < b_F =
    len(sizes), each cut at the tensor boundary nearest to an equal share of the total (each part at least one
    tensor; ties to the earlier boundary)."""
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    bounds = [0]
    for k in range(1, fragments):
        target = prefix[-1] * k / fragments
        candidates = range(bounds[-1] + 1, len(sizes) - (fragments - k) + 1)
        bounds.append(min(candidates, key=lambda i: (abs(prefix[i] - target), i)))
    return bounds + [len(sizes)]


def offsets(length: int, fragments: int) -> List[int]:
    """The step of a round of `length` steps after which each fragment's sync starts: ceil((f + 1) H / F)."""
    return [-(-(f + 1) * length // fragments) for f in range(fragments)]


def qsr_length(sync_every: int, alpha: float, lr: float, cap: int) -> int:
    """QSR's H for learning rate `lr`: max(sync_every, floor((alpha / lr)^2)), at most `cap`."""
    if lr <= 0:
        return cap
    ratio = alpha / lr
    return min(cap, max(sync_every, math.floor(min(ratio * ratio, cap))))


class Schedule:
    """The position of one DiLoCo in its schedule (module docstring): the current round, and each fragment's
    sync in flight. Knows nothing of tensors: outer.py asks it what to do at each step and tells it what it did.
    Its settings are DiLoCo's, checked, with the number of fragments resolved (settings.resolve_fragments)."""

    def __init__(self, sync_every: int, sync_delay: int, fragments: int, warm_start: int,
                 qsr_alpha: Optional[float], max_sync_every: Optional[int]) -> None:
        self.sync_every, self.sync_delay, self.fragments = sync_every, sync_delay, fragments
        self.warm_start, self.qsr_alpha, self.max_sync_every = warm_start, qsr_alpha, max_sync_every
        self.round_start = 0  # the inner step after which the current round began
        self.length: Optional[int] = None  # the current round's; None until the first step plans it
        self.rounds = 0  # rounds ended
        self.peak_lr: Optional[float] = None  # the highest learning rate read at a round's start (the H schedule)
        self.last_start = [0] * fragments  # the inner step after which each fragment last started a sync
        self.pending: List[Optional[List[int]]] = [None] * fragments  # [started at, applies at, round] in flight
        self._starts: Dict[int, List[int]] = {}  # this round's plan: inner step -> fragments that start then

    def settings(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in SETTINGS}

    def reads_lr(self) -> bool:
        """Whether the next round's length depends on the learning rate (the H schedule, after the warm start)."""
        return self.qsr_alpha is not None and self.round_start >= self.warm_start

    def begin(self, lr: Optional[float]) -> int:
        """Plans the round that begins after inner step `round_start` (`lr`: the learning rate then, when
        `reads_lr()`); returns its length."""
        if self.round_start < self.warm_start:
            self.length = 1
        elif self.qsr_alpha is None:
            self.length = self.sync_every
        else:
            rising = self.peak_lr is None or lr >= self.peak_lr
            self.peak_lr = lr if rising else self.peak_lr
            self.length = self.sync_every if rising else qsr_length(self.sync_every, self.qsr_alpha, lr,
                                                                   self.max_sync_every)
        self._plan()
        return self.length

    def _plan(self) -> None:
        self._starts = {}
        for f, offset in enumerate(offsets(self.length, self.fragments)):
            self._starts.setdefault(self.round_start + offset, []).append(f)

    def due(self, step: int) -> List[int]:
        """The fragments whose outer step applies at inner step `step`."""
        return [f for f, p in enumerate(self.pending) if p is not None and p[1] == step]

    def starting(self, step: int) -> List[int]:
        """The fragments whose sync starts at inner step `step`."""
        return self._starts.get(step, [])

    def ends_round(self, step: int) -> bool:
        return self.length is not None and step == self.round_start + self.length

    def start(self, fragment: int, step: int) -> None:
        """Fragment `fragment`'s sync started at inner step `step` (its outer step applies at once in the warm
        start, else sync_delay steps later)."""
        delay = 0 if self.round_start < self.warm_start else self.sync_delay
        self.pending[fragment] = [step, step + delay, self.rounds + 1]
        self.last_start[fragment] = step

    def applied(self, fragment: int) -> None:
        self.pending[fragment] = None

    def end_round(self, step: int) -> None:
        """The round ended after inner step `step`; the next one begins there (plan it with `begin`)."""
        self.rounds += 1
        self.round_start = step

    def unsynced(self, step: int) -> List[int]:
        """At the end of training after inner step `step`: the fragments with steps since their last sync."""
        return [f for f in range(self.fragments) if step > self.last_start[f]]

    def describe(self, fragment: int) -> str:
        """The sync of `fragment` in flight, for an error message."""
        started, _, round_ = self.pending[fragment]
        part = f", fragment {fragment} of {self.fragments}" if self.fragments > 1 else ""
        return f"the outer sync of round {round_}{part} (started at inner step {started})"

    def state_dict(self) -> Dict[str, Any]:
        return {"round_start": self.round_start, "length": self.length, "rounds": self.rounds,
                "peak_lr": self.peak_lr, "last_start": list(self.last_start),
                "pending": [None if p is None else list(p) for p in self.pending]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.round_start, self.length, self.rounds = state["round_start"], state["length"], state["rounds"]
        self.peak_lr, self.last_start = state["peak_lr"], list(state["last_start"])
        self.pending = [None if p is None else list(p) for p in state["pending"]]
        if self.length is not None:
            self._plan()


def first_release_state(state: Mapping[str, Any], sync_every: int, sync_delay: int) -> Dict[str, Any]:
    """The schedule's state in a DiLoCo state_dict() of the releases before fragments (one fragment, rounds of
    sync_every steps; "pending": the inner step its sync in flight started at, or None)."""
    started = state["pending"]
    return {"round_start": state["round_start"], "length": sync_every, "rounds": state["rounds"], "peak_lr": None,
            "last_start": [state["round_start"]],
            "pending": [None if started is None else [started, started + sync_delay, state["rounds"]]]}
