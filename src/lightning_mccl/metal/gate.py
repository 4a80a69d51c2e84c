"""Whether a rank reduces on a device (Metal) or on the CPU, decided once, at first use, by every rank.

1. Selection: MCCL_METAL=0 (the default) keeps the CPU reducer. auto or 1: the device reducer is tried
   when it is available (macOS, MPS, torch.mps.compile_shader).
2. Self-test: the device reducer must reproduce the CPU reducer bit for bit on random bit patterns (so
   NaN, Inf, subnormals and signed zeros occur), odd lengths, and every supported dtype and op. Any NaN
   matches any NaN; every other element must have the same bits.
3. Agreement: every rank posts its vote (yes, or no and why) to the Store and reads all the others'; the
   device is used only when all said yes, so every rank computes with the same arithmetic. Ranks with
   MCCL_METAL=0 vote too (no), so mixed settings cannot leave a rank waiting.
4. Fallback: a refusal, a failed self-test or a device error later on is logged once (a warning with
   MCCL_METAL=1, info with auto) and the CPU reducer is used from then on.

Reductions smaller than MCCL_METAL_MIN_BYTES always stay on the CPU. The device reducer is anything with
`name`, `device`, `unavailable_reason()` and `reduce_(dst, src, op)` (kernels.MetalReducer on a Mac; the
tests use stand-ins on the CPU).

The reference is the engine's own CPU reducer (lightning_mccl._C.reduce_into).
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Callable, List, Optional, Set

from .settings import MetalSettings

log = logging.getLogger("lightning_mccl.metal")
DTYPES = ("float32", "float16", "bfloat16")
TEST_OPS = ("sum", "product", "min", "max")
TEST_LENGTHS = (1, 3, 1023, 4099)
VOTE_KEY = "mccl_metal_vote/{rank}"

_logged: Set[str] = set()
_logged_lock = threading.Lock()


def log_once(level: int, message: str) -> None:
    with _logged_lock:
        if message in _logged:
            return
        _logged.add(message)
    log.log(level, message)


def cpu_reduce_(dst, src, op: str) -> None:
    """dst = dst OP src with the engine's CPU reducer (the reference for the self-test)."""
    from lightning_mccl import _C

    _C.reduce_into(dst, src, op)


def _random_bits(dtype: str, n: int, gen):
    """n values of dtype from random bit patterns, one in eight replaced by a special value."""
    import torch

    t = getattr(torch, dtype)
    if dtype == "float32":
        bits = torch.randint(-(1 << 31), 1 << 31, (n,), generator=gen, dtype=torch.int64).to(torch.int32)
        special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, 1.17e-38,
                                3.4e38, 1.0, -2.5], dtype=t)
    else:
        bits = torch.randint(-(1 << 15), 1 << 15, (n,), generator=gen, dtype=torch.int64).to(torch.int16)
        special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 6e-8, 6.1e-5,
                                65504.0 if dtype == "float16" else 3e38, 1.0, -2.5], dtype=t)
    values = bits.view(t).clone()
    pick = torch.randint(0, 8, (n,), generator=gen) == 0
    values[pick] = special[torch.randint(0, len(special), (int(pick.sum()),), generator=gen)]
    return values


def first_difference(got, want) -> Optional[int]:
    """Index of the first element whose bits differ (any NaN matches any NaN), or None."""
    import torch

    int_type = torch.int32 if got.element_size() == 4 else torch.int16
    same = (got.view(int_type) == want.view(int_type)) | (torch.isnan(got) & torch.isnan(want))
    bad = (~same).nonzero()
    return None if len(bad) == 0 else int(bad[0])


def self_test(reducer, seed: int = 0) -> Optional[str]:
    """None when `reducer` matches the CPU reducer bit for bit on every case, else what differed."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    for dtype in DTYPES:
        for op in TEST_OPS:
            for n in TEST_LENGTHS:
                a, b = _random_bits(dtype, n, gen), _random_bits(dtype, n, gen)
                want = a.clone()
                cpu_reduce_(want, b, op)
                dst, src = a.to(reducer.device), b.to(reducer.device)
                reducer.reduce_(dst, src, op)
                got = dst.cpu()
                i = first_difference(got, want)
                if i is not None:
                    return (f"{dtype} {op} n={n}: element {i} is {got[i].item()!r} where the CPU reducer gives "
                            f"{want[i].item()!r} (inputs {a[i].item()!r}, {b[i].item()!r})")
    return None


@dataclass(frozen=True)
class Decision:
    device: Optional[str]  # the device reducer's name when it is used, else None (the CPU reducer)
    reason: str


def own_vote(settings: MetalSettings, reducer) -> dict:
    """This rank's vote: {"ok": bool, "device": name or None, "reason": why}."""
    def no(reason: str) -> dict:
        return {"ok": False, "device": None, "reason": reason}

    if settings.mode == "0":
        return no(settings.describe())
    if reducer is None:
        return no("no device reducer in this build")
    why = reducer.unavailable_reason()
    if why is not None:
        return no(f"{reducer.name} unavailable: {why}")
    try:
        failure = self_test(reducer)
    except Exception as e:  # a device that fails to compile or run the kernels
        failure = f"raised {type(e).__name__}: {e}"
    if failure is not None:
        return no(f"{reducer.name} self-test failed: {failure}")
    return {"ok": True, "device": reducer.name, "reason": f"{reducer.name} passed the self-test"}


def agree(votes: List[dict], rank: int) -> Decision:
    """Rank `rank`'s decision from every rank's vote: the device only when all of them said yes."""
    if all(v["ok"] for v in votes):
        return Decision(votes[rank]["device"], f"{votes[rank]['reason']} on all {len(votes)} ranks")
    if not votes[rank]["ok"]:
        return Decision(None, votes[rank]["reason"])
    r = next(r for r, v in enumerate(votes) if not v["ok"])
    return Decision(None, f"rank {r} declined: {votes[r]['reason']}")


class ReductionPath:
    """One rank's reduction path: decide() once (every rank must call it), then reduce_() per reduction."""

    def __init__(self, store, rank: int, world: int, settings: Optional[MetalSettings] = None,
                 reducer_factory: Optional[Callable[[], object]] = None):
        self.store, self.rank, self.world = store, rank, world
        self.settings = settings or MetalSettings.from_env()
        self._factory = reducer_factory
        self._reducer = None
        self._decision: Optional[Decision] = None
        self._lock = threading.Lock()

    def _refusal_level(self) -> int:
        return logging.WARNING if self.settings.mode == "1" else logging.INFO

    def decide(self) -> Decision:
        with self._lock:
            if self._decision is None:
                self._decision = self._vote()
            return self._decision

    def _vote(self) -> Decision:
        if self.settings.mode != "0" and self._factory is not None:
            self._reducer = self._factory()
        vote = own_vote(self.settings, self._reducer)
        self.store.set(VOTE_KEY.format(rank=self.rank), json.dumps(vote))
        votes = [json.loads(self.store.get(VOTE_KEY.format(rank=r))) for r in range(self.world)]
        decision = agree(votes, self.rank)
        if decision.device is None and self.settings.mode != "0":
            log_once(self._refusal_level(), f"mccl rank {self.rank}: CPU reducer ({decision.reason})")
        return decision

    def reduce_(self, dst, src, op: str) -> str:
        """dst = dst OP src (CPU tensors); returns which reducer did it ("cpu" or the device's name)."""
        decision = self.decide()
        nbytes = dst.numel() * dst.element_size()
        if decision.device is not None and nbytes >= self.settings.min_bytes:
            try:
                d, s = dst.to(self._reducer.device), src.to(self._reducer.device)
                self._reducer.reduce_(d, s, op)
                dst.copy_(d.cpu())
                return decision.device
            except Exception as e:
                self._decision = Decision(None, f"{decision.device} failed: {type(e).__name__}: {e}")
                log_once(self._refusal_level(),
                         f"mccl rank {self.rank}: {self._decision.reason}; the CPU reducer from now on")
        cpu_reduce_(dst, src, op)
        return "cpu"
