"""`MCCLElasticDiLoCoStrategy` ("mccl_elastic_diloco"): DiLoCo in a Lightning Trainer while Macs leave and join
(docs/elastic.md).

    trainer = Trainer(strategy=MCCLElasticDiLoCoStrategy(sync_every=4), num_nodes=4, max_epochs=10)
    # mccl launch --hostfile fleet.yaml --elastic --min-nodes 2 -- python train.py

`MCCLElasticStrategy` with a round of `sync_every` inner steps as its elastic step (elastic/diloco.py has the
schedule): the sampler deals each round's samples (`sync_every` global batches) to the round's members, each
trains on its slice in `sync_every` batches with no collective (the model is not wrapped in DDP), and the round's
last batch ends with the outer allreduce of the pseudo-gradients, weighted by the samples behind them, and the
members' vote. A committed round applies the outer step on every member; a dropped one (a member lost during it)
puts every member's weights, buffers and inner optimizer back to the round's start and is trained again, in the
same batch, with its samples dealt to the new membership. So membership changes at round boundaries only, a
joiner is admitted there and receives the weights (the anchor), the inner optimizer's state of the member that
sends it and the outer optimizer's state, and the anchor is never half-updated. Each member's share of a round
follows its measured speed (its batches grow or shrink; H stays).

Checkpoints are taken at round boundaries (Lightning's epoch-end checkpoints are: an epoch is whole rounds);
one asked for in the middle of a round is refused. Unlike `MCCLDiLoCoStrategy` the outer allreduce does not
overlap the next round, and `sync_delay`, the warm start, the H schedule, fragments and `compress` are not
taken.
"""
from __future__ import annotations

from typing import Any, Optional

from typing_extensions import override

from ..accuracy_costs import DILOCO, Mode
from ..diloco.outer import OuterOptimizer
from ..diloco.settings import OUTER_LR, OUTER_MOMENTUM, SYNC_EVERY, check_settings
from ..elastic import ElasticDiLoCo, Step
from .elastic_strategy import MCCLElasticStrategy

OWNER = "MCCLElasticDiLoCoStrategy"
CHECKPOINT_KEY = "mccl_elastic_diloco"  # the outer optimizer's state in a checkpoint


class MCCLElasticDiLoCoStrategy(MCCLElasticStrategy):
    """Elastic DiLoCo (module docstring).

    Args:
        sync_every: inner optimizer steps (batches) per round, H (default 3).
        outer_lr, outer_momentum, outer_optimizer: the outer step, as `MCCLDiLoCoStrategy`'s (defaults: lr 1,
            no momentum: the members' weights averaged, weighted by their samples).
        The rest are `MCCLElasticStrategy`'s (settings, global_batch: the samples of one inner step over all
        members, seed, config, ...).
    """

    strategy_name = "mccl_elastic_diloco"

    def __init__(self, sync_every: int = SYNC_EVERY, outer_lr: float = OUTER_LR,
                 outer_momentum: float = OUTER_MOMENTUM, outer_optimizer: Optional[OuterOptimizer] = None,
                 **kwargs: Any) -> None:
        check_settings(sync_every, outer_lr, outer_momentum, 1, OWNER)
        super().__init__(**kwargs)
        self.sync_every, self.outer_lr, self.outer_momentum = sync_every, outer_lr, outer_momentum
        self.outer_optimizer = outer_optimizer
        self.diloco: Optional[ElasticDiLoCo] = None  # during a fit
        self._resumed_outer: Optional[dict] = None

    @override
    def comm_mode(self) -> Mode:
        plain = self.outer_optimizer is None and (self.outer_lr, self.outer_momentum) == (OUTER_LR, OUTER_MOMENTUM)
        return Mode(DILOCO, None, sync_every=self.sync_every, sync_delay=None, plain_averaging=plain)

    @override
    def _batches_per_step(self) -> int:
        return self.sync_every

    @override
    def _config(self, global_batch: int) -> dict:
        return {**super()._config(global_batch), "sync_every": self.sync_every,
                "outer": [self.outer_lr, self.outer_momentum, repr(self.outer_optimizer)]}

    @override
    def configure_ddp(self) -> None:
        """No DDP: each member trains on its own between round ends."""

    @override
    def _first_step(self) -> Optional[Step]:
        if len(self.optimizers) != 1:
            raise ValueError(f"{OWNER}: DiLoCo counts one inner optimizer's steps; configure_optimizers returned "
                             f"{len(self.optimizers)}")
        self.diloco = ElasticDiLoCo(self.lightning_module, self.optimizers[0], self.manager, outer_lr=self.outer_lr,
                                    outer_momentum=self.outer_momentum, outer_optimizer=self.outer_optimizer)
        if self._resumed_outer is not None:
            self.diloco.load_state_dict(self._resumed_outer)
        step = super()._first_step()  # the state received here carries the outer optimizer's
        self.diloco.begin_round()
        return step

    @override
    def _training_state(self) -> dict:
        return {"lightning": super()._training_state(), "diloco": self.diloco.state_dict()}

    @override
    def _load_training_state(self, state: dict) -> None:
        super()._load_training_state(state["lightning"])
        self.diloco.load_state_dict(state["diloco"])

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        """An inner step; after the round's last, the outer allreduce and the vote, and a dropped round trained
        again with its samples dealt to the new membership."""
        result = closure()
        self._inner_step(optimizer, result, self.batches.taken, model, **kwargs)
        if not self.batches.step_ends:
            return result
        while not self.diloco.end_round():
            step = self._start_step()
            if step is None:  # this member left at that boundary
                return None
            for ids in self.batches.split(step.ids):
                result = self._redo(closure, ids)
                self._inner_step(optimizer, result, len(ids), model, **kwargs)
        self.diloco.begin_round()
        return result

    def _inner_step(self, optimizer: Any, result: Any, samples: int, model: Any, **kwargs: Any) -> None:
        if samples:  # a batch of no sample (a round smaller than the members) steps nothing
            self._apply(optimizer, result, model, **kwargs)

    @override
    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Optional[Any] = None) -> None:
        if self.diloco is not None:
            if not self.batches.step_ends:
                raise ValueError(f"{OWNER}: a checkpoint was asked for in the middle of a round (after global step "
                                 f"{self.lightning_module.trainer.global_step}); elastic DiLoCo checkpoints at round "
                                 f"boundaries: take them every n epochs, or every n train steps with n a multiple "
                                 f"of sync_every={self.sync_every}")
            checkpoint[CHECKPOINT_KEY] = self.diloco.state_dict()
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict:
        checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
        if CHECKPOINT_KEY not in checkpoint:
            raise ValueError(f"{OWNER}: the checkpoint {checkpoint_path} has no {CHECKPOINT_KEY!r} state (the outer "
                             f"optimizer's), so it was not written by an elastic DiLoCo fit")
        self._resumed_outer = checkpoint[CHECKPOINT_KEY]
        return checkpoint


__all__ = ["MCCLElasticDiLoCoStrategy"]
