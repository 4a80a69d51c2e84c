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

**The outer step.** Every rank keeps the anchor (the global weights of the last outer step, the same bits on
every rank) and trains on its own data. When a sync starts (at a round's end; schedule.py says when, with the
warm start, the H schedule and fragments) the rank starts averaging its pseudo-gradient, the anchor minus its
weights (its own progress since the last sync, negated), with one asynchronous allreduce (`Averaging`), and
keeps training. `sync_delay` inner steps later (tau, 1 <= tau <= H) it waits for the average, moves the anchor
by an outer Nesterov SGD step, and shifts its weights by the same amount less its own progress up to the sync:

    delta_i = anchor - w_i                        when the sync starts, then allreduce(delta_i) starts
    anchor' = outer optimizer step, grad mean(delta)   tau inner steps later (default: torch's SGD, Nesterov)
    u = anchor - anchor';  w_i += delta_i - u

so w_i = new anchor + what the rank learnt in the tau steps since the sync started: no step is lost, and the
next pseudo-gradient is again exactly the rank's progress over its round. With fragments each part of the
parameters does this on its own steps, with its own slice of the vectors below and its own outer optimizer.
The outer optimizer is any torch optimizer over the anchor (`outer_optimizer`, a function of the parameters
that makes one, as torchft's DiLoCo takes one); the default is SGD with `outer_lr` and Nesterov momentum
`outer_momentum`. tau = H applies each outer step one round late (the most time for the allreduce); tau = 1 the
soonest (the least staleness). Floating-point buffers (BatchNorm statistics) travel in the last fragment's
allreduce and are replaced by their average. docs/diloco.md says how to choose H, tau, the outer step and the
options for short jobs.

**State.** `state_dict()` holds the settings, the schedule's position (schedule.py: the round, each fragment's
sync in flight), the anchor, the outer optimizers' state and, while a sync is not yet applied, the averages
(waiting for them, which a checkpoint may do at any step: applying stays where the schedule puts it, so a
resumed run takes the same steps); `LOCAL_KEYS` are the entries that differ between ranks (this rank's
pseudo-gradients in flight, the averaging's own state), everything else is the same on every rank. A failed
allreduce (a dead peer: the engine's DistBackendError on every rank) raises before anything is applied.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import torch
import torch.distributed as dist

from .. import metal
from .averaging import AllreduceMean, Averaging, InFlight
from .schedule import SETTINGS, Schedule, first_release_state, fragment_bounds
from .settings import (AUTO, FRAGMENTS, MAX_SYNC_EVERY, OUTER_LR, OUTER_MOMENTUM, QSR_ALPHA, SYNC_DELAY,
                       WARM_START, check_schedule, check_settings, resolve_fragments)

LOCAL_KEYS = ("own", "averaging")  # state_dict entries that differ between ranks
# A checkpoint's settings where it predates them: those of the releases before the options for short jobs (the
# whole model in one fragment)
FIRST_RELEASE = {"warm_start": WARM_START, "fragments": 1, "qsr_alpha": QSR_ALPHA, "max_sync_every": MAX_SYNC_EVERY}


OuterOptimizer = Callable[[List[torch.Tensor]], torch.optim.Optimizer]  # makes the outer optimizer of the anchor


def synced_tensors(model: torch.nn.Module, owner: str) -> tuple:
    """(the trainable floating-point parameters, the floating-point buffers, their device) of the `model` DiLoCo
    syncs; ValueError naming `owner` when they are on more than one device."""
    params = [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    devices = {t.device for t in params + buffers}
    if len(devices) > 1:
        raise ValueError(f"{owner}: DiLoCo needs the model on one device, its tensors are on "
                         f"{sorted(map(str, devices))}")
    return params, buffers, devices.pop() if devices else torch.device("cpu")


def default_outer_optimizer(outer_lr: float, outer_momentum: float) -> OuterOptimizer:
    """SGD with `outer_lr` and Nesterov momentum `outer_momentum` (none at 0): the DiLoCo paper's outer step."""
    def make(params: List[torch.Tensor]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
    return make


class _Fragment:
    """One fragment's parameters and its slices of DiLoCo's vectors (views, made once)."""

    def __init__(self, params: List[torch.Tensor], views: List[torch.Tensor], anchor: torch.Tensor,
                 own: torch.Tensor, flat: torch.Tensor, wire: torch.Tensor, buffers: bool) -> None:
        self.params, self.views, self.anchor, self.own, self.flat = params, views, anchor, own, flat
        self.own_views = _views(own, params)
        self.wire, self.buffers = wire, buffers  # what its allreduce carries: its pseudo-gradients (+ the buffers)
        self.optimizer: Optional[torch.optim.Optimizer] = None


class DiLoCo:
    """The outer loop around a model's inner training (module docstring). `model`'s trainable floating-point
    parameters (all on one device) are synced, its floating-point buffers averaged.

    Args:
        sync_every: inner optimizer steps per round (H), at least 1.
        outer_lr, outer_momentum: the default outer optimizer's learning rate (> 0) and Nesterov momentum
            (0 <= mu < 1); the defaults, 1 and 0, replace the anchor by the ranks' average.
        outer_optimizer: instead, a function that makes the outer optimizer from the anchor's tensors (shaped as
            the parameters; one per fragment), e.g. `lambda params: torch.optim.SGD(params, lr=0.7,
            momentum=0.9, nesterov=True)`.
        sync_delay: inner steps between a sync's start and its outer step (tau), 1 to sync_every.
        warm_start: the first inner steps synchronous: each a round of one step, its outer step applied at once.
        fragments: the trainable parameters in this many contiguous parts of about equal size, each synced on
            its own step of the round (schedule.py); at most the number of parameter tensors. "auto" (the
            default): min(sync_every, the trainable parameter tensors), or, resuming, the checkpoint's count; 1:
            the whole model at the round's end.
        qsr_alpha, max_sync_every: the H schedule (schedule.py): H = max(sync_every, floor((qsr_alpha / lr)^2))
            once the inner optimizer's learning rate falls below its peak, at most max_sync_every (needed).
            It reads the learning rate of the optimizer given to `attach`.
        averaging: how the pseudo-gradients are averaged (default: AllreduceMean on the default group).
        group: the group `broadcast` and the H schedule's check run on (default: averaging's group if it has
            one, else the default group).
        owner: named in the errors (the Lightning strategy passes its name).
    """

    def __init__(self, model: torch.nn.Module, sync_every: int, *, outer_lr: float = OUTER_LR,
                 outer_momentum: float = OUTER_MOMENTUM, outer_optimizer: Optional[OuterOptimizer] = None,
                 sync_delay: int = SYNC_DELAY, warm_start: int = WARM_START,
                 fragments: Union[int, str] = FRAGMENTS,
                 qsr_alpha: Optional[float] = QSR_ALPHA, max_sync_every: Optional[int] = MAX_SYNC_EVERY,
                 averaging: Optional[Averaging] = None, group: Optional[Any] = None, owner: str = "DiLoCo") -> None:
        check_settings(sync_every, outer_lr, outer_momentum, sync_delay, owner)
        check_schedule(sync_every, warm_start, fragments, qsr_alpha, max_sync_every, owner)
        self.model, self.owner, self.auto_fragments = model, owner, fragments == AUTO
        self.averaging = averaging if averaging is not None else AllreduceMean()
        self.group = group if group is not None else getattr(self.averaging, "group", None)
        self.params, self.buffers, device = synced_tensors(model, owner)
        n = sum(p.numel() for p in self.params)
        f32 = dict(dtype=torch.float32, device=device)
        self.anchor, self.own = torch.zeros(n, **f32), torch.zeros(n, **f32)
        self.comm = torch.zeros(n + sum(b.numel() for b in self.buffers), **f32)  # pseudo-gradients, then buffers
        views = _views(self.comm, self.params + self.buffers)
        self._comm_views, self._buffer_views = views, views[len(self.params):]
        self._anchor_views = _views(self.anchor, self.params)
        self._outer_optimizer = outer_optimizer
        self._default_optimizer = default_outer_optimizer(float(outer_lr), float(outer_momentum))
        self._form(Schedule(sync_every, sync_delay, resolve_fragments(fragments, sync_every, len(self.params)),
                            warm_start, qsr_alpha, max_sync_every))
        # Metal kernels for the per-value work on an MPS tensor, where the ranks agreed on them (metal/): the
        # pseudo-gradient, and the default outer step fused with this rank's correction. None: torch ops.
        self._kernels = metal.kernels(self.group, device)
        self._fused_step = self._kernels is not None and outer_optimizer is None
        self.inner_steps = 0  # inner optimizer steps taken
        self._check: Optional[List[Any]] = None  # the H schedule's agreement in flight: [work, tensor, round, H]
        self._hook: Optional[Any] = None  # the inner optimizer's step post-hook (attach)
        self._optimizer: Optional[torch.optim.Optimizer] = None  # the inner optimizer (attach)

    def _form(self, schedule: Schedule) -> None:
        """Cuts the parameters into `schedule.fragments` fragments, each with a new outer optimizer, and starts
        `schedule` (at the beginning: nothing in flight)."""
        count = schedule.fragments
        if count > len(self.params):
            raise ValueError(f"{self.owner}(fragments={count}): the model has {len(self.params)} trainable "
                             f"parameter tensors, and each fragment is one or more of them")
        self.schedule = schedule
        # Each fragment's outer optimizer takes the mean pseudo-gradient as its gradient, in place. The default
        # optimizer sees the fragment's anchor as one vector (so that a fused kernel can run its step); one given
        # sees it shaped as the parameters, as it would see the model.
        bounds = fragment_bounds([p.numel() for p in self.params], count)
        offset = [sum(p.numel() for p in self.params[:i]) for i in bounds]
        self._fragments = []
        for f, (i, j, lo, hi) in enumerate(zip(bounds, bounds[1:], offset, offset[1:])):
            last = f == count - 1
            fragment = _Fragment(self.params[i:j], self._comm_views[i:j], self.anchor[lo:hi], self.own[lo:hi],
                                 self.comm[lo:hi], self.comm[lo:len(self.comm) if last else hi], last)
            if self._outer_optimizer is None:
                fragment.anchor.grad = fragment.flat
                fragment.optimizer = self._default_optimizer([fragment.anchor])
            else:
                for view, grad in zip(self._anchor_views[i:j], fragment.views):
                    view.grad = grad
                fragment.optimizer = self._outer_optimizer(self._anchor_views[i:j])
            self._fragments.append(fragment)
        self.outer_optimizers = [fragment.optimizer for fragment in self._fragments]
        self._in_flight: List[Optional[InFlight]] = [None] * count  # each fragment's averaging until waited for

    @property
    def fragments(self) -> int:
        """The number of fragments the parameters sync in ("auto" resolved, or a resumed checkpoint's)."""
        return self.schedule.fragments

    @property
    def rounds(self) -> int:
        """Rounds ended (the syncs of the whole model started)."""
        return self.schedule.rounds

    # -- the loop --------------------------------------------------------------------------------------------

    def attach(self, optimizer: torch.optim.Optimizer, step_hook: bool = True) -> None:
        """Calls `step()` after every step of `optimizer` (its step post-hook), until `detach()`; the H schedule
        reads its learning rate. `step_hook=False`: only the latter (the caller calls `step()`)."""
        self.detach()
        self._optimizer = optimizer
        if step_hook:
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
        with torch.no_grad():
            for a, p in zip(self._anchor_views, self.params):
                a.copy_(p)

    def step(self) -> None:
        """After every inner optimizer step: what the schedule says (schedule.py, "One inner step")."""
        self._begin_step()
        self._end_step()

    # The two halves of a step, which benchmarks/diloco_sim.py runs for its simulated ranks in lockstep.
    def _begin_step(self) -> None:
        if self.schedule.length is None:  # the first round, planned at the first step (after attach)
            self._begin_round()
        self._wait_check()  # the round's H agreed, one step after it began: every rank stops at the same step
        self.inner_steps += 1
        for f in self.schedule.due(self.inner_steps):
            self._apply(f)
        for f in self.schedule.starting(self.inner_steps):
            self._start(f)

    def _end_step(self) -> None:
        for f in self.schedule.due(self.inner_steps):  # at once: the warm start's
            self._apply(f)
        if self.schedule.ends_round(self.inner_steps):
            self.schedule.end_round(self.inner_steps)
            self._begin_round()

    def finish(self) -> None:
        """At the end of training: applies the pending outer steps, syncs what has not been since its last sync
        (at once), and sets every rank's parameters to the anchor (the same bits everywhere)."""
        self._finish_starts()
        self._finish_applies()

    def _finish_starts(self) -> None:
        self.detach()
        self._wait_check()
        for f, pending in enumerate(self.schedule.pending):
            if pending is not None:
                self._apply(f)
        unsynced = self.schedule.unsynced(self.inner_steps)
        for f in unsynced:
            self._start(f)
        if unsynced:
            self.schedule.end_round(self.inner_steps)

    def _finish_applies(self) -> None:
        for f, pending in enumerate(self.schedule.pending):
            if pending is not None:
                self._apply(f)
        with torch.no_grad():
            for p, a in zip(self.params, self._anchor_views):
                p.copy_(a)

    def _begin_round(self) -> None:
        """Plans the round that begins now; with the H schedule, starts checking that every rank chose its H."""
        reads = self.schedule.reads_lr()
        length = self.schedule.begin(self._lr() if reads else None)
        if reads and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            both = torch.tensor([length, -length], dtype=torch.int64)  # max and -min in one allreduce
            work = dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
            self._check = [work, both, self.schedule.rounds + 1, length]

    def _lr(self) -> float:
        if self._optimizer is None:
            raise ValueError(f"{self.owner}(qsr_alpha={self.schedule.qsr_alpha}): the H schedule reads the inner "
                             f"optimizer's learning rate: give the optimizer to attach() first")
        return float(self._optimizer.param_groups[0]["lr"])

    def _wait_check(self) -> None:
        """The H schedule's agreement: ValueError on every rank if they differ."""
        if self._check is None:
            return
        work, both, round_, length = self._check
        work.wait()
        self._check = None
        if int(both[0]) != -int(both[1]):
            raise ValueError(f"{self.owner}(qsr_alpha={self.schedule.qsr_alpha}): the ranks chose different H for "
                             f"round {round_}, from {-int(both[1])} to {int(both[0])} (this rank {length}): the H "
                             f"schedule needs the same learning rate on every rank at each round's start (an lr "
                             f"scheduler stepped alike everywhere; a ReduceLROnPlateau on a metric logged with "
                             f"sync_dist=True)")

    def _start(self, f: int) -> None:
        if self.schedule.pending[f] is not None:  # a shorter round brought its next sync closer than tau
            self._apply(f)
        fragment = self._fragments[f]
        with torch.no_grad():
            for view, p in zip(fragment.views, fragment.params):
                view.copy_(p)
            if self._kernels is not None:
                self._kernels.pseudo_gradient(fragment.anchor, fragment.flat, fragment.own)
            else:
                torch.sub(fragment.anchor, fragment.flat, out=fragment.flat)  # anchor - w_i
                fragment.own.copy_(fragment.flat)
            if fragment.buffers:
                for view, b in zip(self._buffer_views, self.buffers):
                    view.copy_(b)
        self._in_flight[f] = self.averaging.start(fragment.wire, f)
        self.schedule.start(f, self.inner_steps)

    def _wait(self, f: int) -> None:
        if self._in_flight[f] is not None:
            try:
                self._in_flight[f].wait()
            except Exception as e:
                raise _named(e, f"{self.owner}: {self.schedule.describe(f)} failed; the anchor is unchanged: "
                                f"{e}") from e
            self._in_flight[f] = None

    def _apply(self, f: int) -> None:
        self._wait(f)  # raises before anything changes
        fragment = self._fragments[f]
        with torch.no_grad():
            if self._fused_step:  # SGD's step, momentum and all, and delta_i - u in one pass
                group = fragment.optimizer.param_groups[0]
                momentum = fragment.optimizer.state[fragment.anchor].setdefault(
                    "momentum_buffer", torch.zeros_like(fragment.anchor))
                self._kernels.outer_step(fragment.anchor.grad, momentum, fragment.anchor, fragment.own,
                                         group["lr"], group["momentum"])
            else:
                fragment.own.sub_(fragment.anchor)  # delta_i - u = (delta_i - anchor before) + anchor after
                fragment.optimizer.step()  # the anchor, by the mean pseudo-gradient (its grad)
                fragment.own.add_(fragment.anchor)
            for p, c in zip(fragment.params, fragment.own_views):
                p.add_(c)
            if fragment.buffers:
                for b, v in zip(self.buffers, self._buffer_views):
                    b.copy_(v)
        self.schedule.applied(f)

    # -- checkpoints -----------------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The outer state (module docstring); waits for the syncs in flight, without applying them."""
        self._wait_check()
        for f in range(len(self._fragments)):
            self._wait(f)
        pending = any(p is not None for p in self.schedule.pending)
        return {**self.schedule.settings(), "inner_steps": self.inner_steps, "schedule": self.schedule.state_dict(),
                "anchor": self.anchor.clone(),
                "outer_optimizer": [copy.deepcopy(o.state_dict()) for o in self.outer_optimizers],
                "mean": self.comm.clone() if pending else None, "own": self.own.clone() if pending else None,
                "averaging": self.averaging.state_dict() if hasattr(self.averaging, "state_dict") else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores `state_dict()` into a DiLoCo made with the same settings, on the model whose (this rank's)
        weights were restored already; also the state of the releases before fragments, and of the first
        releases, whose outer step was SGD with its momentum as one vector ("momentum"). With fragments="auto"
        the checkpoint's number of fragments is taken (the parameters cut anew). ValueError when the settings
        or the sizes differ."""
        saved = {name: state.get(name, FIRST_RELEASE.get(name)) for name in SETTINGS}
        mine = {**self.schedule.settings(), **({"fragments": saved["fragments"]} if self.auto_fragments else {})}
        if saved != mine:
            differ = [name for name in SETTINGS if saved[name] != mine[name]]
            also = (f" (fragments={saved['fragments']}, or {AUTO!r}, which takes the checkpoint's)"
                    if "fragments" in differ else "")
            raise ValueError(f"{self.owner}: the checkpoint's DiLoCo ran with "
                             f"{', '.join(f'{k}={saved[k]!r}' for k in differ)}, this run has "
                             f"{', '.join(f'{k}={mine[k]!r}' for k in differ)}: resume with the same settings{also}")
        if state["anchor"].numel() != self.anchor.numel():
            raise ValueError(f"{self.owner}: the checkpoint's anchor has {state['anchor'].numel()} values, this "
                             f"model's trainable parameters {self.anchor.numel()}")
        if mine["fragments"] != self.fragments:
            self._form(Schedule(**mine))
        first_releases = "schedule" not in state
        schedule = first_release_state(state, mine["sync_every"], mine["sync_delay"]) if first_releases \
            else state["schedule"]
        pending = any(p is not None for p in schedule["pending"])
        if pending and state.get("own") is None:
            raise ValueError(f"{self.owner}: the checkpoint has a sync in flight but not this rank's pseudo-gradient")
        self.inner_steps = state["inner_steps"]
        self.schedule.load_state_dict(schedule)
        if state.get("averaging") is not None and hasattr(self.averaging, "load_state_dict"):
            self.averaging.load_state_dict(state["averaging"])
        self.anchor.copy_(state["anchor"])
        if "outer_optimizer" in state:
            states = [state["outer_optimizer"]] if first_releases else state["outer_optimizer"]
            for optimizer, optimizer_state in zip(self.outer_optimizers, states):
                optimizer.load_state_dict(optimizer_state)
        else:
            self._load_momentum(state["momentum"], state["rounds"] - (state["pending"] is not None))
        self._in_flight, self._check = [None] * len(self._fragments), None
        if pending:
            self.comm.copy_(torch.cat([state["mean"], state["buffers_mean"]]) if first_releases else state["mean"])
            self.own.copy_(state["own"])

    def _load_momentum(self, momentum: torch.Tensor, applied: int) -> None:
        """The first releases' outer momentum (one vector, zeros until the first outer step) as the default SGD's
        momentum buffer; nothing when no outer step was applied yet or the optimizer keeps no momentum."""
        optimizer = self.outer_optimizers[0]
        if applied >= 1 and optimizer.param_groups[0].get("momentum"):
            anchor = self._fragments[0].anchor
            optimizer.state[anchor]["momentum_buffer"] = momentum.to(anchor.device).clone()


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
