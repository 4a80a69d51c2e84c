"""The elastic sampler: each step's global batch of sample ids, dealt to whoever is a member at that step.

An epoch is one stream of sample ids: a permutation of ``range(num_samples)`` seeded by ``(seed, epoch)``.
Every step takes the next ``global_batch`` ids of that stream (the last step of an epoch takes what is left)
and deals them to the step's members, in member order, each a contiguous slice whose length follows its
share (equal shares unless given; largest remainders, ties to the earlier member). So the global batch does
not depend on how many members there are, and neither does a learning-rate schedule counted in steps; only
each member's slice does.

A step ends one of two ways, the same on every member (the commit decision is one value in the Store):

- committed: its ids are written into the epoch's ledger, each with the step that trained it; an id the
  ledger already holds is an error (it would be trained twice);
- dropped (a member failed during it): its ids go back, ahead of the stream, and the next step deals exactly
  them again, to the members of that next step.

Every member holds the same sampler state, because every member applies the same decisions in the same
order; the state (epoch, position in the stream, ids given back, the epoch's ledger) is what a joiner
receives and what a checkpoint stores (`state_dict`). `digest()` hashes it, so the members can check at
every step boundary that they agree.

Nothing here imports torch: the ids are numpy arrays (PCG64, the same permutation on every platform).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

UNTRAINED = -1  # the ledger's value for an id no committed step has trained yet


def split_sizes(total: int, shares: Sequence[float]) -> List[int]:
    """`total` items split in proportion to `shares` (largest remainders; ties to the earlier member)."""
    if not shares:
        raise ValueError("cannot deal a batch to no members")
    if any(not (s >= 0) for s in shares) or sum(shares) <= 0:
        raise ValueError(f"shares must be non-negative with a positive sum, got {list(shares)}")
    whole = sum(shares)
    return largest_remainder(total, [total * s / whole for s in shares])


def largest_remainder(total: int, exact: Sequence[float]) -> List[int]:
    """Whole numbers summing to `total` from non-negative `exact` parts that sum to it: each the whole part of
    its exact part, then one more each to the largest remainders (ties to the earlier member)."""
    sizes = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in by_remainder[:total - sum(sizes)]:
        sizes[i] += 1
    return sizes


@dataclass(frozen=True)
class Deal:
    """One step's ids: the whole global batch, and each member's slice of it (by member id)."""

    epoch: int
    ids: np.ndarray
    slices: Dict[str, np.ndarray]

    def of(self, member: str) -> np.ndarray:
        return self.slices[member]


class ElasticSampler:
    """Deals each step's global batch to the current members; see the module docstring."""

    def __init__(self, num_samples: int, global_batch: int, *, seed: int = 0, epoch: int = 0):
        if num_samples < 1 or global_batch < 1:
            raise ValueError(f"ElasticSampler needs num_samples >= 1 and global_batch >= 1, got {num_samples} and "
                             f"{global_batch}")
        self.num_samples = int(num_samples)
        self.global_batch = int(global_batch)
        self.seed = int(seed)
        self._start_epoch(int(epoch))

    def _start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._stream = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        self._position = 0
        self._returned = np.empty(0, dtype=np.int64)
        self._in_flight: Optional[np.ndarray] = None
        self._ledger = np.full(self.num_samples, UNTRAINED, dtype=np.int64)
        self._chain = ""  # a hash chained over the epoch's commits (digest), so it need not hash the ledger

    # ---- one step -----------------------------------------------------------------------------------------

    def deal(self, members: Sequence[str], shares: Optional[Sequence[float]] = None) -> Deal:
        """The next step's ids, dealt to `members` (in that order) by `shares` (default: equal)."""
        if self._in_flight is not None:
            raise RuntimeError("ElasticSampler.deal: the previous step's ids were neither committed nor dropped")
        if self.epoch_done:
            raise RuntimeError(f"ElasticSampler.deal: epoch {self.epoch} is done; call next_epoch() first")
        if shares is not None and len(shares) != len(members):
            raise ValueError(f"{len(shares)} shares for {len(members)} members")
        if len(set(members)) != len(members):
            raise ValueError(f"members are not unique: {list(members)}")
        taken = self._returned[:self.global_batch]
        more = self.global_batch - len(taken)
        fresh = self._stream[self._position:self._position + more]
        ids = np.concatenate([taken, fresh]).astype(np.int64)
        self._returned = self._returned[len(taken):]
        self._position += len(fresh)
        self._in_flight = ids
        sizes = split_sizes(len(ids), [1.0] * len(members) if shares is None else shares)
        bounds = np.cumsum([0] + sizes)
        return Deal(self.epoch, ids, {m: ids[bounds[i]:bounds[i + 1]] for i, m in enumerate(members)})

    def commit(self, step: int) -> None:
        """The dealt ids were trained by committed step `step`: into the ledger, each once."""
        ids = self._take_in_flight("commit")
        again = ids[self._ledger[ids] != UNTRAINED]
        if len(again):
            raise RuntimeError(f"ElasticSampler: ids {again[:8].tolist()} of epoch {self.epoch} were already trained "
                               f"(steps {self._ledger[again[:8]].tolist()}); step {step} would train them again")
        self._ledger[ids] = step
        self._chain = hashlib.sha256(self._chain.encode() + np.int64(step).tobytes() + ids.tobytes()).hexdigest()

    def drop(self) -> None:
        """The dealt ids were not trained (the step was dropped): deal them again, first."""
        ids = self._take_in_flight("drop")
        self._returned = np.concatenate([ids, self._returned])

    def _take_in_flight(self, what: str) -> np.ndarray:
        if self._in_flight is None:
            raise RuntimeError(f"ElasticSampler.{what}: no step was dealt")
        ids, self._in_flight = self._in_flight, None
        return ids

    # ---- epochs and the ledger ----------------------------------------------------------------------------

    @property
    def epoch_done(self) -> bool:
        """Every id of the epoch was dealt and committed."""
        return self._position == self.num_samples and len(self._returned) == 0 and self._in_flight is None

    def next_epoch(self) -> None:
        if not self.epoch_done:
            raise RuntimeError(f"ElasticSampler.next_epoch: epoch {self.epoch} still has ids to train")
        self._start_epoch(self.epoch + 1)

    def ledger(self) -> np.ndarray:
        """This epoch's ledger: for every id, the committed step that trained it, or UNTRAINED (-1)."""
        return self._ledger.copy()

    def untrained(self) -> np.ndarray:
        return np.flatnonzero(self._ledger == UNTRAINED)

    # ---- state ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What a joiner receives and a checkpoint stores. Only between steps (no ids in flight)."""
        if self._in_flight is not None:
            raise RuntimeError("ElasticSampler.state_dict: a step's ids are in flight (take the state between steps)")
        return {"num_samples": self.num_samples, "global_batch": self.global_batch, "seed": self.seed,
                "epoch": self.epoch, "position": self._position, "returned": self._returned.tolist(),
                "ledger": self._ledger.copy(), "chain": self._chain}

    def load_state_dict(self, state: dict) -> None:
        mine = (self.num_samples, self.global_batch, self.seed)
        theirs = (state["num_samples"], state["global_batch"], state["seed"])
        if mine != theirs:
            raise ValueError(f"ElasticSampler.load_state_dict: the state is of (num_samples, global_batch, seed) = "
                             f"{theirs}, this sampler's is {mine}")
        self._start_epoch(int(state["epoch"]))
        self._position = int(state["position"])
        self._returned = np.asarray(state["returned"], dtype=np.int64)
        self._ledger = np.asarray(state["ledger"], dtype=np.int64).copy()
        self._chain = str(state["chain"])

    def digest(self) -> str:
        """A short hash of the state: equal on members that agree (checked at every step boundary)."""
        h = hashlib.sha256()
        h.update(np.array([self.epoch, self._position, self.num_samples, self.global_batch, self.seed],
                          dtype=np.int64).tobytes())
        h.update(self._returned.tobytes())
        h.update(self._chain.encode())
        return h.hexdigest()[:16]


__all__ = ["ElasticSampler", "Deal", "split_sizes", "largest_remainder", "UNTRAINED"]
