"""DiLoCo: local training with an outer sync that overlaps compute (Douillard et al., arXiv 2311.08105), for raw
torch and for `MCCLStrategy(sync="diloco")`. No Lightning here.

    outer = DiLoCo(model, sync_every=4, averaging=AllreduceMean(outer_group({"MCCL_WIRE_DTYPE": "bf16"})))
    outer.broadcast()                  # every rank starts from rank 0's weights: the first anchor
    for x, y in data:                  # no gradient allreduce: the model is not wrapped in DDP
        loss_fn(model(x), y).backward()
        opt.step(); opt.zero_grad()
        outer.step()                   # after every inner optimizer step
    outer.finish()                     # the last round synced; every rank holds the anchor

**The schedule.** Every rank keeps the anchor (the global weights of the last outer step, the same bits on every
rank) and trains on its own data. A round is `sync_every` inner steps (H). At the round's end the rank starts
averaging its pseudo-gradient, the anchor minus its weights (its own progress over the round, negated), with one
asynchronous allreduce (`Averaging`), and keeps training. `sync_delay` inner steps later (tau, 1 <= tau <= H) it
waits for the average, moves the anchor by an outer Nesterov SGD step, and shifts its weights by the same amount
less its own progress up to the round's end:

    delta_i = anchor - w_i                                   at the round's end, then allreduce(delta_i) starts
    m = mu m + mean(delta);  u = lr (mean(delta) + mu m)    tau inner steps later (torch SGD, nesterov=True)
    anchor -= u;  w_i += delta_i - u

so w_i = new anchor + what the rank learnt in the tau steps since the round's end: no step is lost, and the next
pseudo-gradient is again exactly the rank's progress over its round. tau = H applies each outer step one round
late (the most time for the allreduce); tau = 1 the soonest (the least staleness). Floating-point buffers
(BatchNorm statistics) travel in the same allreduce and are replaced by their average. docs/diloco.md says why
this overlap and not Streaming DiLoCo's fragments, and how to choose H, tau and the outer step.

**State.** `state_dict()` holds the anchor, the outer momentum, the position in the round and the average of a
sync not yet applied (waiting for it, which a checkpoint may do at any step: applying stays tau steps after the
round's end, so a resumed run takes the same steps); `LOCAL_KEYS` are the entries that differ between ranks
(this rank's pseudo-gradient in flight), everything else is the same on every rank. A failed allreduce (a dead
peer: the engine's DistBackendError on every rank) raises before anything is applied.

**Transport.** `Averaging` is the one pluggable piece: `start(flat)` begins averaging a float32 vector over the
ranks and returns something whose `wait()` leaves the mean in it. `AllreduceMean` is one allreduce on a group;
its wire type is the group's (`outer_group(settings)`: a dedicated mccl group, so that its allreduce neither
queues behind nor holds up other collectives, with `MCCL_WIRE_DTYPE=bf16` the engine narrows on the wire and
accumulates in float32). `CastMean` casts the vector to bf16 or fp16 on its device and allreduces that, as
torch's compress hooks do a DDP bucket: on an accelerator the copies through host memory then move half the
bytes too (`averaging_for` picks it there, as `compress="bf16"` does under DDP). `Int8Mean` is the engine's
8-bit allreduce (`lightning_mccl.int8`) with error feedback: the residual of each round's quantisation is added
to the next round's pseudo-gradient, and is part of this rank's state (`LOCAL_KEYS`). An averaging with
`state_dict`/`load_state_dict` has them checkpointed.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Protocol

import torch
import torch.distributed as dist

LOCAL_KEYS = ("own", "averaging")  # state_dict entries that differ between ranks
# The outer step's defaults: plain averaging of the ranks' progress every round (local SGD). The DiLoCo paper's
# Nesterov 0.7 / 0.9 (for H = 500) lost far more at H = 2-32 (docs/diloco.md, "Choosing H, tau and the learning
# rates for 2-24 Macs").
OUTER_LR = 1.0
OUTER_MOMENTUM = 0.0


class InFlight(Protocol):
    def wait(self) -> None:
        """Blocks until the average is in the vector `start` was given (raises what the collective raised)."""


class Averaging(Protocol):
    def start(self, flat: torch.Tensor) -> InFlight:
        """Begins averaging `flat` (1-D float32, in place) over the ranks; returns at once."""


class AllreduceMean:
    """The mean over `group`'s ranks by one asynchronous allreduce (sum, then divided by the group's size): the
    engine's progress thread runs it while the caller computes; the group decides the wire type."""

    def __init__(self, group: Optional[Any] = None) -> None:
        self.group = group

    def start(self, flat: torch.Tensor) -> InFlight:
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
    vector and divides it there."""

    def __init__(self, dtype: torch.dtype, group: Optional[Any] = None) -> None:
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"CastMean casts to torch.bfloat16 or torch.float16, not {dtype}")
        self.dtype, self.group = dtype, group
        self._half: Optional[torch.Tensor] = None

    def start(self, flat: torch.Tensor) -> InFlight:
        if self._half is None or self._half.shape != flat.shape or self._half.device != flat.device:
            self._half = torch.empty_like(flat, dtype=self.dtype)
        self._half.copy_(flat)
        work = dist.all_reduce(self._half, group=self.group, async_op=True)
        return _Widen(work, self._half, flat, dist.get_world_size(self.group))


class _Widen(_Sum):
    def __init__(self, work: Any, half: torch.Tensor, flat: torch.Tensor, size: int) -> None:
        super().__init__(work, flat, size)
        self.half = half

    def wait(self) -> None:
        self.work.wait()
        self.flat.copy_(self.half).div_(self.size)


class Int8Mean:
    """The mean over `group`'s ranks by the engine's 8-bit allreduce (lightning_mccl.int8), with error feedback: a
    residual kept on the vector's device (where its per-value work runs), carried from one round to the next (and
    in checkpoints)."""

    def __init__(self, group: Optional[Any] = None) -> None:
        from .int8 import ErrorFeedback

        self.group = group
        self.feedback = ErrorFeedback()

    def start(self, flat: torch.Tensor) -> InFlight:
        from .int8 import all_reduce

        return all_reduce(flat, self.feedback.residual("diloco", flat), "avg", self.group)

    def state_dict(self) -> Dict[Any, torch.Tensor]:
        return self.feedback.state_dict()

    def load_state_dict(self, state: Mapping[Any, torch.Tensor]) -> None:
        self.feedback.load_state_dict(dict(state))


HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}  # the 16-bit wire types and what they cast to


def averaging_for(wire: Optional[str], group: Any, device: torch.device) -> Averaging:
    """The averaging `MCCLStrategy(sync="diloco", compress=wire)` uses for vectors on `device` over `group`: the
    8-bit allreduce for "int8"; for "bf16"/"fp16" on an accelerator, the cast on the device (CastMean); else one
    allreduce, which on the CPU the group's MCCL_WIRE_DTYPE narrows on the wire."""
    if wire == "int8":
        return Int8Mean(group)
    if wire in HALF and device.type != "cpu":
        return CastMean(HALF[wire], group)
    return AllreduceMean(group)


def outer_group(settings: Optional[Mapping[str, str]] = None, backend: str = "mccl") -> Any:
    """A new process group of every rank for the outer allreduce (collective: every rank calls it). Over mccl,
    `settings` (MCCL_* variables, e.g. {"MCCL_WIRE_DTYPE": "bf16"}) become its pg_options."""
    if backend != "mccl":
        return dist.new_group(backend=backend)
    from .options import Options

    return dist.new_group(backend=backend, pg_options=Options(dict(settings or {})))


class DiLoCo:
    """The outer loop around a model's inner training (module docstring). `model`'s trainable floating-point
    parameters (all on one device) are synced, its floating-point buffers averaged.

    Args:
        sync_every: inner optimizer steps per round (H), at least 1.
        outer_lr, outer_momentum: the outer Nesterov SGD step's learning rate (> 0) and momentum (0 <= mu < 1);
            the defaults, 1 and 0, replace the anchor by the ranks' average.
        sync_delay: inner steps between a round's end and its outer step (tau), 1 to sync_every.
        averaging: how the pseudo-gradients are averaged (default: AllreduceMean on the default group).
        group: the group `broadcast` runs on (default: averaging's group if it has one, else the default group).
        owner: named in the errors (the Lightning strategy passes "MCCLStrategy").
    """

    def __init__(self, model: torch.nn.Module, sync_every: int, *, outer_lr: float = OUTER_LR,
                 outer_momentum: float = OUTER_MOMENTUM, sync_delay: int = 1, averaging: Optional[Averaging] = None,
                 group: Optional[Any] = None, owner: str = "DiLoCo") -> None:
        check_settings(sync_every, outer_lr, outer_momentum, sync_delay, owner)
        self.model, self.owner = model, owner
        self.sync_every, self.sync_delay = sync_every, sync_delay
        self.outer_lr, self.outer_momentum = float(outer_lr), float(outer_momentum)
        self.averaging = averaging if averaging is not None else AllreduceMean()
        self.group = group if group is not None else getattr(self.averaging, "group", None)
        self.params = [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        devices = {t.device for t in self.params + self.buffers}
        if len(devices) > 1:
            raise ValueError(f"{owner}: DiLoCo needs the model on one device, its tensors are on "
                             f"{sorted(map(str, devices))}")
        device = devices.pop() if devices else torch.device("cpu")
        n = sum(p.numel() for p in self.params)
        f32 = dict(dtype=torch.float32, device=device)
        self.anchor, self.momentum, self.own = (torch.zeros(n, **f32) for _ in range(3))
        self.comm = torch.zeros(n + sum(b.numel() for b in self.buffers), **f32)  # pseudo-gradients, then buffers
        self._views = _views(self.comm, self.params + self.buffers)
        self._param_views, self._buffer_views = self._views[:len(self.params)], self._views[len(self.params):]
        self.inner_steps = 0  # inner optimizer steps taken
        self.round_start = 0  # inner_steps when the current round began
        self.rounds = 0  # outer syncs started
        self._pending: Optional[int] = None  # inner_steps when the sync not yet applied started
        self._in_flight: Optional[InFlight] = None  # its averaging, until waited for

    # -- the loop --------------------------------------------------------------------------------------------

    def broadcast(self, src: int = 0) -> None:
        """Every rank takes rank `src`'s parameters and buffers (all of them), which become the anchor."""
        works = [dist.broadcast(t.data, src, group=self.group, async_op=True)
                 for t in list(self.model.parameters()) + list(self.model.buffers())]
        for work in works:
            work.wait()
        self._pack(self.anchor, self.params)

    def step(self) -> None:
        """After every inner optimizer step: applies the pending outer step when its delay is up, then starts the
        round's sync when the round is over (in this order: with sync_delay == sync_every both fall together)."""
        self.inner_steps += 1
        if self._pending is not None and self.inner_steps - self._pending == self.sync_delay:
            self._apply()
        if self.inner_steps - self.round_start == self.sync_every:
            self._start()

    def finish(self) -> None:
        """At the end of training: applies the pending outer step, syncs the last, partial round (at once), and
        sets every rank's parameters to the anchor (the same bits everywhere)."""
        if self._pending is not None:
            self._apply()
        if self.inner_steps > self.round_start:
            self._start()
            self._apply()
        with torch.no_grad():
            for p, a in zip(self.params, _views(self.anchor, self.params)):
                p.copy_(a)

    def _start(self) -> None:
        assert self._pending is None, "a sync is still pending when the next one starts (sync_delay > sync_every?)"
        n = self.anchor.numel()
        delta = self.comm[:n]
        self._pack(delta, self.params)
        torch.sub(self.anchor, delta, out=delta)  # anchor - w_i
        self.own.copy_(delta)
        self._pack(self.comm[n:], self.buffers, self._buffer_views)
        self._in_flight = self.averaging.start(self.comm)
        self._pending, self.round_start = self.inner_steps, self.inner_steps
        self.rounds += 1

    def _wait(self) -> None:
        if self._in_flight is not None:
            try:
                self._in_flight.wait()
            except Exception as e:
                raise _named(e, f"{self.owner}: the outer sync of round {self.rounds} (started at inner step "
                                f"{self._pending}) failed; the anchor is unchanged: {e}") from e
            self._in_flight = None

    def _apply(self) -> None:
        self._wait()  # raises before anything changes
        n = self.anchor.numel()
        mean, mu = self.comm[:n], self.outer_momentum
        with torch.no_grad():
            self.momentum.mul_(mu).add_(mean)
            step = mean.add_(self.momentum, alpha=mu).mul_(self.outer_lr)  # u = lr (mean + mu m), in comm
            self.anchor.sub_(step)
            correction = self.own.sub_(step)  # delta_i - u
            for p, c in zip(self.params, _views(correction, self.params)):
                p.add_(c)
            for b, v in zip(self.buffers, self._buffer_views):
                b.copy_(v)
        self._pending = None

    def _pack(self, flat: torch.Tensor, tensors: List[torch.Tensor],
              views: Optional[List[torch.Tensor]] = None) -> None:
        with torch.no_grad():
            for v, t in zip(views if views is not None else _views(flat, tensors), tensors):
                v.copy_(t)

    # -- checkpoints -----------------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The outer state (module docstring); waits for a sync in flight, without applying it."""
        self._wait()
        pending = self._pending is not None
        n = self.anchor.numel()
        return {"sync_every": self.sync_every, "sync_delay": self.sync_delay, "inner_steps": self.inner_steps,
                "round_start": self.round_start, "rounds": self.rounds, "pending": self._pending,
                "anchor": self.anchor.clone(), "momentum": self.momentum.clone(),
                "mean": self.comm[:n].clone() if pending else None,
                "buffers_mean": self.comm[n:].clone() if pending else None,
                "own": self.own.clone() if pending else None,
                "averaging": self.averaging.state_dict() if hasattr(self.averaging, "state_dict") else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores `state_dict()` into a DiLoCo made with the same settings, on the model whose (this rank's)
        weights were restored already. ValueError when the settings or the sizes differ."""
        saved = (state["sync_every"], state["sync_delay"])
        if saved != (self.sync_every, self.sync_delay):
            raise ValueError(f"{self.owner}: the checkpoint's DiLoCo ran with sync_every={saved[0]}, "
                             f"sync_delay={saved[1]}, this run has sync_every={self.sync_every}, "
                             f"sync_delay={self.sync_delay}: resume with the same settings")
        if state["anchor"].numel() != self.anchor.numel():
            raise ValueError(f"{self.owner}: the checkpoint's anchor has {state['anchor'].numel()} values, this "
                             f"model's trainable parameters {self.anchor.numel()}")
        if state["pending"] is not None and state.get("own") is None:
            raise ValueError(f"{self.owner}: the checkpoint has a sync in flight but not this rank's pseudo-gradient")
        self.inner_steps, self.round_start, self.rounds = state["inner_steps"], state["round_start"], state["rounds"]
        if state.get("averaging") is not None and hasattr(self.averaging, "load_state_dict"):
            self.averaging.load_state_dict(state["averaging"])
        self.anchor.copy_(state["anchor"])
        self.momentum.copy_(state["momentum"])
        self._pending, self._in_flight = state["pending"], None
        if self._pending is not None:
            n = self.anchor.numel()
            self.comm[:n].copy_(state["mean"])
            self.comm[n:].copy_(state["buffers_mean"])
            self.own.copy_(state["own"])


def check_settings(sync_every: Any, outer_lr: Any, outer_momentum: Any, sync_delay: Any, owner: str) -> None:
    """ValueError naming the setting for anything DiLoCo cannot run with."""
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"{owner}(sync_every={sync_every!r}): expected the inner steps per round, an int >= 1")
    if isinstance(sync_delay, bool) or not isinstance(sync_delay, int) or not 1 <= sync_delay <= sync_every:
        raise ValueError(f"{owner}(sync_delay={sync_delay!r}): expected an int from 1 to sync_every={sync_every} "
                         f"(inner steps between a round's end and its outer step)")
    if isinstance(outer_lr, bool) or not isinstance(outer_lr, (int, float)) or not outer_lr > 0:
        raise ValueError(f"{owner}(outer_lr={outer_lr!r}): expected a number > 0")
    if isinstance(outer_momentum, bool) or not isinstance(outer_momentum, (int, float)) \
            or not 0 <= outer_momentum < 1:
        raise ValueError(f"{owner}(outer_momentum={outer_momentum!r}): expected a number in [0, 1)")


def _named(error: Exception, message: str) -> Exception:
    """`error`'s type (DistBackendError for a dead peer) with `message`, or `error` itself if that type cannot
    be made from a message."""
    try:
        return type(error)(message)
    except Exception:  # noqa: BLE001 - keep the original error then
        return error


def _views(flat: torch.Tensor, tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """Views of `flat` (consecutive, in order) shaped as `tensors`."""
    out, offset = [], 0
    for t in tensors:
        out.append(flat[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()
    return out
