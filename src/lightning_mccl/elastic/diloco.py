"""`ElasticDiLoCo`: DiLoCo's outer step over the elastic group, one round per elastic step (docs/elastic.md).

Under elastic DiLoCo the manager's step is a round: `start_step` deals the round's samples (H inner steps of the
global batch) to the round's members, each trains H inner steps on its slice with no collective, and the round
ends in one allreduce and the vote (`end_round`). So membership changes only at round boundaries: a joiner is
admitted there, and a member lost during a round fails that round alone. The schedule, for a round:

    begin_round()     the anchor: the weights, the same on every member (it follows a commit, or the state sent);
                      a copy of the inner optimizer's state and of the floating-point buffers
    ... H inner steps on the member's slice (the caller's loop) ...
    end_round()       delta = anchor - weights (the member's progress), then the floating-point buffers, into one
                      vector; `manager.allreduce` sums it over the members weighted by each one's part of the
                      round's samples (a member dealt none counts for nothing), then `should_commit`:
      committed       the outer optimizer steps the anchor with the weighted mean delta as its gradient (default:
                      SGD with outer_lr and Nesterov momentum outer_momentum; lr 1, momentum 0: the weighted mean
                      of the members' weights); every member's weights become the new anchor, its buffers the
                      weighted mean
      dropped         every member's weights, buffers and inner optimizer state go back to the round's start
                      (nothing of the round applied, on any member); the caller deals the round again

The anchor is never half-updated: the outer step runs only after every member voted that its allreduce
succeeded. Unlike `lightning_mccl.diloco.DiLoCo` the outer allreduce does not overlap the next round (its result
must be decided before the round can end), and neither the warm start, the H schedule nor fragments apply.

`state_dict()` is the outer optimizer's state: at a round boundary the anchor is the weights, which the
caller's state carries. The inner optimizer's state is each member's own (a joiner receives the sender's).
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional

import torch

from ..diloco.outer import OuterOptimizer, default_outer_optimizer, synced_tensors
from ..diloco.settings import OUTER_LR, OUTER_MOMENTUM
from .manager import ElasticManager


class ElasticDiLoCo:
    """The rounds' outer step of one member (module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, manager: ElasticManager, *,
                 outer_lr: float = OUTER_LR, outer_momentum: float = OUTER_MOMENTUM,
                 outer_optimizer: Optional[OuterOptimizer] = None):
        self.model, self.optimizer, self.manager = model, optimizer, manager
        self.params, self.buffers, device = synced_tensors(model, "ElasticDiLoCo")
        n = sum(p.numel() for p in self.params)
        self.anchor = torch.zeros(n, dtype=torch.float32, device=device)
        self.comm = torch.zeros(n + sum(b.numel() for b in self.buffers), dtype=torch.float32, device=device)
        self.anchor.grad = self.comm[:n]  # the outer optimizer's gradient: the mean delta, in place
        make = outer_optimizer or default_outer_optimizer(float(outer_lr), float(outer_momentum))
        self.outer = make([self.anchor])
        self._saved_inner: Optional[Dict[str, Any]] = None
        self._saved_buffers: List[torch.Tensor] = []

    @torch.no_grad()
    def begin_round(self) -> None:
        """The round starts: the weights are the anchor; the inner optimizer's state and the buffers are kept."""
        if self.params:
            torch.cat([p.detach().reshape(-1).float() for p in self.params], out=self.anchor)
        self._saved_inner = copy.deepcopy(self.optimizer.state_dict())
        self._saved_buffers = [b.detach().clone() for b in self.buffers]

    def end_round(self) -> bool:
        """The round's allreduce and vote; True: the outer step was applied, False: the round was rolled back."""
        n = self.anchor.numel()
        with torch.no_grad():
            if self.params:
                torch.sub(self.anchor, torch.cat([p.detach().reshape(-1).float() for p in self.params]),
                          out=self.comm[:n])
            if self.buffers:
                torch.cat([b.detach().reshape(-1).float() for b in self.buffers], out=self.comm[n:])
        self.manager.allreduce(self.comm).wait()
        if self.manager.should_commit():
            self.outer.step()
            self._write(self.anchor, self.comm[n:])
            return True
        self._write(self.anchor, torch.cat([b.reshape(-1).float() for b in self._saved_buffers])
                    if self._saved_buffers else self.comm[n:])
        self.optimizer.load_state_dict(self._saved_inner)
        return False

    @torch.no_grad()
    def _write(self, weights: torch.Tensor, buffers: torch.Tensor) -> None:
        offset = 0
        for t in self.params:
            t.copy_(weights[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        offset = 0
        for t in self.buffers:
            t.copy_(buffers[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def state_dict(self) -> Dict[str, Any]:
        """The outer optimizer's state (at a round boundary; the anchor is the weights)."""
        return {"outer_optimizer": self.outer.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.outer.load_state_dict(state["outer_optimizer"])


__all__ = ["ElasticDiLoCo"]
