"""DiLoCo: local training with an outer sync that overlaps compute (Douillard et al., arXiv 2311.08105), for raw
torch and for `MCCLDiLoCoStrategy` ("mccl_diloco"). No Lightning here.

    outer = DiLoCo(model, sync_every=4, averaging=AllreduceMean(outer_group({"MCCL_WIRE_DTYPE": "bf16"})))
    outer.broadcast()                  # every rank starts from rank 0's weights: the first anchor
    outer.attach(opt)                  # counts the inner optimizer's steps (its step post-hook)
    for x, y in data:                  # no gradient allreduce: the model is not wrapped in DDP
        loss_fn(model(x), y).backward()
        opt.step(); opt.zero_grad()    # the hook calls outer.step() after each
    outer.finish()                     # the last round synced; every rank holds the anchor

**The unit.** Everything counts the inner optimizer's steps: a round is `sync_every` of them (H), whatever the
batches per step (gradient accumulation) are.

**The schedule.** Every rank keeps the anchor (the global weights of the last outer step, the same bits on every
rank) and trains on its own data. A round is `sync_every` inner steps (H). At the round's end the rank starts
averaging its pseudo-gradient, the anchor minus its weights (its own progress over the round, negated), with one
asynchronous allreduce (`Averaging`), and keeps training. `sync_delay` inner steps later (tau, 1 <= tau <= H) it
waits for the average, moves the anchor by an outer Nesterov SGD step, and shifts its weights by the same amount
less its own progress up to the round's end:

    delta_i = anchor - w_i                        at the round's end, then allreduce(delta_i) starts
    anchor' = outer optimizer step, grad mean(delta)   tau inner steps later (default: torch's SGD, Nesterov)
    u = anchor - anchor';  w_i += delta_i - u

so w_i = new anchor + what the rank learnt in the tau steps since the round's end: no step is lost, and the next
pseudo-gradient is again exactly the rank's progress over its round. The outer optimizer is any torch
optimizer over the anchor (`outer_optimizer`, a function of the parameters that makes one, as torchft's
DiLoCo takes one); the default is SGD with `outer_lr` and Nesterov momentum `outer_momentum`. tau = H applies each outer step one round
late (the most time for the allreduce); tau = 1 the soonest (the least staleness). Floating-point buffers
(BatchNorm statistics) travel in the same allreduce and are replaced by their average. docs/diloco.md says why
this overlap and not Streaming DiLoCo's fragments, and how to choose H, tau and the outer step.

**State.** `state_dict()` holds the anchor, the outer optimizer's state, the position in the round and the average of a
sync not yet applied (waiting for it, which a checkpoint may do at any step: applying stays tau steps after the
round's end, so a resumed run takes the same steps); `LOCAL_KEYS` are the entries that differ between ranks
(this rank's pseudo-gradient in flight), everything else is the same on every rank. A failed allreduce (a dead
peer: the engine's DistBackendError on every rank) raises before anything is applied.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch
import torch.distributed as dist

from .. import metal
from .averaging import AllreduceMean, Averaging, InFlight
from .settings import OUTER_LR, OUTER_MOMENTUM, check_settings

LOCAL_KEYS = ("own", "averaging")  # state_dict entries that differ between ranks


OuterOptimizer = Callable[[List[torch.Tensor]], torch.optim.Optimizer]  # makes the outer optimizer of the anchor


def default_outer_optimizer(outer_lr: float, outer_momentum: float) -> OuterOptimizer:
    """SGD with `outer_lr` and Nesterov momentum `outer_momentum` (none at 0): the DiLoCo paper's outer step."""
    def make(params: List[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
    return make


class DiLoCo:
    """The outer loop around a model's inner training (module docstring). `model`'s trainable floating-point
    parameters (all on one device) are synced, its floating-point buffers averaged.

    Args:
        sync_every: inner optimizer steps per round (H), at least 1.
        outer_lr, outer_momentum: the default outer optimizer's learning rate (> 0) and Nesterov momentum
            (0 <= mu < 1); the defaults, 1 and 0, replace the anchor by the ranks' average.
        outer_optimizer: instead, a function that makes the outer optimizer from the anchor's tensors (shaped as
            the parameters), e.g. `lambda params: torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)`.
        sync_delay: inner steps between a round's end and its outer step (tau), 1 to sync_every.
        averaging: how the pseudo-gradients are averaged (default: AllreduceMean on the default group).
        group: the group `broadcast` runs on (default: averaging's group if it has one, else the default group).
        owner: named in the errors (the Lightning strategy passes its name).
    """

    def __init__(self, model: torch.nn.Module, sync_every: int, *, outer_lr: float = OUTER_LR,
                 outer_momentum: float = OUTER_MOMENTUM, outer_optimizer: Optional[OuterOptimizer] = None,
                 sync_delay: int = 1, averaging: Optional[Averaging] = None, group: Optional[Any] = None,
                 owner: str = "DiLoCo") -> None:
        check_settings(sync_every, outer_lr, outer_momentum, sync_delay, owner)
        self.model, self.owner = model, owner
        self.sync_every, self.sync_delay = sync_every, sync_delay
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
        self.anchor, self.own = torch.zeros(n, **f32), torch.zeros(n, **f32)
        self.comm = torch.zeros(n + sum(b.numel() for b in self.buffers), **f32)  # pseudo-gradients, then buffers
        self._views = _views(self.comm, self.params + self.buffers)
        self._param_views, self._buffer_views = self._views[:len(self.params)], self._views[len(self.params):]
        self._anchor_views = _views(self.anchor, self.params)
        # The outer optimizer's gradient is the mean pseudo-gradient, in place. The default optimizer sees the
        # anchor as one vector (so that a fused kernel can run its step); one given sees it shaped as the
        # parameters, as it would see the model.
        if outer_optimizer is None:
            self.anchor.grad = self.comm[:n]
            self.outer_optimizer = default_outer_optimizer(float(outer_lr), float(outer_momentum))([self.anchor])
        else:
            for view, grad in zip(self._anchor_views, self._param_views):
                view.grad = grad
            self.outer_optimizer = outer_optimizer(self._anchor_views)
        # Metal kernels for the per-value work on an MPS tensor, where the ranks agreed on them (metal/): the
        # pseudo-gradient, and the default outer step fused with this rank's correction. None: torch ops.
        self._kernels = metal.kernels(self.group, device)
        self._fused_step = self._kernels is not None and outer_optimizer is None
        self.inner_steps = 0  # inner optimizer steps taken
        self.round_start = 0  # inner_steps when the current round began
        self.rounds = 0  # outer syncs started
        self._pending: Optional[int] = None  # inner_steps when the sync not yet applied started
        self._in_flight: Optional[InFlight] = None  # its averaging, until waited for
        self._hook: Optional[Any] = None  # the inner optimizer's step post-hook (attach)

    # -- the loop --------------------------------------------------------------------------------------------

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """Calls `step()` after every step of `optimizer` (its step post-hook), until `detach()`."""
        self.detach()
        self._hook = optimizer.register_step_post_hook(lambda *_: self.step())

    def detach(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

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
        self.detach()
        if self._pending is not None:
            self._apply()
        if self.inner_steps > self.round_start:
            self._start()
            self._apply()
        with torch.no_grad():
            for p, a in zip(self.params, self._anchor_views):
                p.copy_(a)

    def _start(self) -> None:
        assert self._pending is None, "a sync is still pending when the next one starts (sync_delay > sync_every?)"
        n = self.anchor.numel()
        delta = self.comm[:n]
        self._pack(delta, self.params)
        if self._kernels is not None:
            self._kernels.pseudo_gradient(self.anchor, delta, self.own)
        else:
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
        with torch.no_grad():
            if self._fused_step:  # SGD's step, momentum and all, and delta_i - u in one pass
                group = self.outer_optimizer.param_groups[0]
                momentum = self.outer_optimizer.state[self.anchor].setdefault(
                    "momentum_buffer", torch.zeros_like(self.anchor))
                self._kernels.outer_step(self.anchor.grad, momentum, self.anchor, self.own, group["lr"],
                                         group["momentum"])
            else:
                self.own.sub_(self.anchor)  # delta_i - u = (delta_i - anchor before) + anchor after
                self.outer_optimizer.step()  # the anchor, by the mean pseudo-gradient (its grad)
                self.own.add_(self.anchor)
            correction = self.own
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
                "anchor": self.anchor.clone(), "outer_optimizer": copy.deepcopy(self.outer_optimizer.state_dict()),
                "mean": self.comm[:n].clone() if pending else None,
                "buffers_mean": self.comm[n:].clone() if pending else None,
                "own": self.own.clone() if pending else None,
                "averaging": self.averaging.state_dict() if hasattr(self.averaging, "state_dict") else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores `state_dict()` into a DiLoCo made with the same settings, on the model whose (this rank's)
        weights were restored already; also the state of the first releases, whose outer step was SGD with its
        momentum as one vector ("momentum"). ValueError when the settings or the sizes differ."""
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
        if "outer_optimizer" in state:
            self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        else:
            self._load_momentum(state["momentum"], state["rounds"] - (state["pending"] is not None))
        self._pending, self._in_flight = state["pending"], None
        if self._pending is not None:
            n = self.anchor.numel()
            self.comm[:n].copy_(state["mean"])
            self.comm[n:].copy_(state["buffers_mean"])
            self.own.copy_(state["own"])

    def _load_momentum(self, momentum: torch.Tensor, applied: int) -> None:
        """The first releases' outer momentum (one vector, zeros until the first outer step) as the default SGD's
        momentum buffer; nothing when no outer step was applied yet or the optimizer keeps no momentum."""
        if applied >= 1 and self.outer_optimizer.param_groups[0].get("momentum"):
            self.outer_optimizer.state[self.anchor]["momentum_buffer"] = momentum.to(self.anchor.device).clone()


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
