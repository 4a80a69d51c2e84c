"""How DiLoCo averages a round's pseudo-gradients over the ranks (diloco/outer.py has the schedule).

**Transport.** `Averaging` is the one pluggable piece: `start(flat, part)` begins averaging a float32 vector over
the ranks and returns something whose `wait()` leaves the mean in it; `part` is the fragment the vector belongs to
(0 without fragments: schedule.py), whose syncs may be in flight together, each with its own buffers and
residual. `AllreduceMean` is one allreduce on a group; its wire type is the group's (`outer_group(settings)`: a
dedicated mccl group, so that its allreduce neither queues behind nor holds up other collectives, with
`MCCL_WIRE_DTYPE=bf16` the engine narrows on the wire and accumulates in float32). `CastMean` casts the vector
to bf16 or fp16 on its device and allreduces that, as torch's compress hooks do a DDP bucket: on an accelerator
the copies through host memory then move half the bytes too (`averaging_for` picks it there, as
`compress="bf16"` does under DDP). `Int8Mean` is the engine's
8-bit allreduce (`lightning_mccl.int8`) with error feedback: the residual of each round's quantisation is added
to the next round's pseudo-gradient, and is part of this rank's state (`LOCAL_KEYS`). An averaging with
`state_dict`/`load_state_dict` has them checkpointed.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Protocol

import torch
import torch.distributed as dist


class InFlight(Protocol):
    def wait(self) -> None:
        """Blocks until the average is in the vector `start` was given (raises what the collective raised)."""


class Averaging(Protocol):
    def start(self, flat: torch.Tensor, part: int) -> InFlight:
        """Begins averaging `flat` (1-D float32, in place; fragment `part`'s) over the ranks; returns at once."""


class AllreduceMean:
    """The mean over `group`'s ranks by one asynchronous allreduce (sum, then divided by the group's size): the
    engine's progress thread runs it while the caller computes; the group decides the wire type."""

    def __init__(self, group: Optional[Any] = None) -> None:
        self.group = group

    def start(self, flat: torch.Tensor, part: int = 0) -> InFlight:
        return _Sum(dist.all_reduce(flat, group=self.group, async_op=True), flat, dist.get_world_size(self.group))


class _Sum:
    def __init__(self, work: Any, flat: torch.Tensor, size: int) -> None:
        self.work, self.flat, self.size = work, flat, size

    def wait(self) -> None:
        self.work.wait()
        self.flat.div_(self.size)


class CastMean:
    """The mean over `group`'s ranks by one asynchronous allreduce of the vector cast to `dtype` (torch.bfloat16
    or torch.float16) on its own device, into a buffer kept between rounds: the engine sums 16-bit values (each
    partial sum rounded once per hop, as MCCL_WIRE_DTYPE does for float32), and `wait()` widens the sum into the
    vector and divides it there. A buffer per fragment: their syncs may be in flight together."""

    def __init__(self, dtype: torch.dtype, group: Optional[Any] = None) -> None:
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"CastMean casts to torch.bfloat16 or torch.float16, not {dtype}")
        self.dtype, self.group = dtype, group
        self._half: Dict[int, torch.Tensor] = {}

    def start(self, flat: torch.Tensor, part: int = 0) -> InFlight:
        half = self._half.get(part)
        if half is None or half.shape != flat.shape or half.device != flat.device:
            half = self._half[part] = torch.empty_like(flat, dtype=self.dtype)
        half.copy_(flat)
        work = dist.all_reduce(half, group=self.group, async_op=True)
        return _Widen(work, half, flat, dist.get_world_size(self.group))


class _Widen(_Sum):
    def __init__(self, work: Any, half: torch.Tensor, flat: torch.Tensor, size: int) -> None:
        super().__init__(work, flat, size)
        self.half = half

    def wait(self) -> None:
        self.work.wait()
        self.flat.copy_(self.half).div_(self.size)


class Int8Mean:
    """The mean over `group`'s ranks by the engine's 8-bit allreduce (lightning_mccl.int8), with error feedback: a
    residual per fragment, kept on the vector's device (where its per-value work runs), carried from one round to
    the next (and in checkpoints)."""

    def __init__(self, group: Optional[Any] = None) -> None:
        from ..int8 import ErrorFeedback

        self.group = group
        self.feedback = ErrorFeedback()

    def start(self, flat: torch.Tensor, part: int = 0) -> InFlight:
        from ..int8 import all_reduce

        return all_reduce(flat, self.feedback.residual(("diloco", part), flat), "avg", self.group)

    def state_dict(self) -> Dict[Any, torch.Tensor]:
        return self.feedback.state_dict()

    def load_state_dict(self, state: Mapping[Any, torch.Tensor]) -> None:
        # "diloco": the one residual of the releases before fragments
        self.feedback.load_state_dict({("diloco", 0) if k == "diloco" else k: v for k, v in state.items()})


def averaging_for(resolution: Any, group: Any) -> Averaging:
    """The averaging a resolution of the wire policy (wire_policy.resolve(..., diloco=True)) names, over `group`:
    the 8-bit allreduce, a 16-bit cast on the device (CastMean), or one allreduce (which on the CPU the group's
    MCCL_WIRE_DTYPE narrows on the wire)."""
    from .. import wire_policy

    if resolution.averaging == wire_policy.INT8_MEAN:
        return Int8Mean(group)
    if resolution.averaging == wire_policy.CAST_MEAN:
        return CastMean({wire_policy.BF16: torch.bfloat16, wire_policy.FP16: torch.float16}[resolution.cast], group)
    return AllreduceMean(group)


def outer_group(settings: Optional[Mapping[str, str]] = None, backend: Optional[str] = None) -> Any:
    """A new process group of every rank for the outer allreduce (collective: every rank calls it). Over mccl,
    `settings` (MCCL_* variables, e.g. {"MCCL_WIRE_DTYPE": "bf16"}) become its pg_options; `backend` defaults to
    mccl."""
    from ..wire_policy import MCCL

    if backend not in (None, MCCL):
        return dist.new_group(backend=backend)
    from ..options import Options

    return dist.new_group(backend=MCCL, pg_options=Options(dict(settings or {})))
