"""`MCCLElasticStrategy` ("mccl_elastic"): DDP in a Lightning Trainer while Macs leave and join (docs/elastic.md).

    trainer = Trainer(strategy="mccl_elastic", num_nodes=4, max_epochs=10)
    # mccl launch --hostfile fleet.yaml --elastic --min-nodes 2 -- python train.py

It runs the elastic package's loop (lightning_mccl.elastic: membership decided at step boundaries, the group
re-formed in place, the sampler, the state sent to joiners) inside Lightning's fit loop:

- the training data: the DataLoader the LightningModule returns is replaced by `ElasticBatches` over its
  dataset, which starts each step (`ElasticManager.start_step`) when Lightning asks for the next batch, and
  yields this member's slice of the step's global batch (elastic_batches.py);
- the step boundary: `optimizer_step` runs the closure (forward and backward; DDP's hook reduces the gradients
  over the elastic group, weighted by the samples behind them), then the vote (`should_commit`); a step the
  members drop is redone in the same batch with its ids dealt again to the new membership, so every batch is
  one committed step and Lightning's counters (global_step, the epoch, the LR schedulers') follow the sampler's;
- the state: at the first step boundary, and whenever a member joins, a member that holds the state sends the
  whole Lightning checkpoint (model, optimizers, LR schedulers, loops, callbacks) with the sampler's position
  and the RNG states; the receiver loads it as a resumed fit loads a checkpoint. So every member starts from
  host 0's weights, and a joiner from the others' current ones;
- ranks: `global_rank` and `world_size` (`trainer.world_size`) are the current membership's; host 0 is always
  rank 0 (it holds the Store and must stay), so rank-zero logging and checkpoint writing stay on host 0;
- outside a step the members never wait for each other: `barrier` does nothing, `broadcast` returns the
  value, `reduce` and `all_gather` the member's own (validation runs on the whole validation set on every
  member: the members hold the same weights, so they compute the same metrics);
- checkpoints carry the sampler's state (key "mccl_elastic") and resume on any number of members.

Not taken: gradient accumulation, manual optimization, `limit_train_batches`, reloading the dataloaders each
epoch, and `compress` (the gradients travel in float32); each is refused naming itself.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
from torch.nn.parallel.distributed import DistributedDataParallel
from torch.utils._pytree import tree_map
from typing_extensions import override

import lightning.pytorch as pl
from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero_only
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from ..accuracy_costs import DDP, Mode
from ..elastic import ElasticManager, ElasticSampler, ElasticSettings, Step, elastic_ddp
from ..elastic.manager import STORE_HOST
from . import internals
from .base import MCCLBase
from .comm_metrics import CommMetrics
from .elastic_batches import ElasticBatches
from .elastic_environment import ElasticEnvironment
from .group import BACKEND, DEFAULT_TIMEOUT

CHECKPOINT_KEY = "mccl_elastic"  # the sampler's state in a checkpoint
OWNER = "MCCLElasticStrategy"


class MCCLElasticStrategy(MCCLBase):
    """DDP over the elastic group of `mccl`: members leave and join while `fit` goes on (module docstring).

    Args:
        settings: the elastic settings (`ElasticSettings`: timeouts, the minimum of members, pacing by speed).
        global_batch: the samples of one step over all members, which stays the same whatever the membership;
            default the training DataLoader's batch_size x the Trainer's num_nodes x devices.
        seed: the sampler's seed (each epoch's order of the sample ids).
        config: the run's settings that a joiner must share (a string or anything JSON-able); the global batch
            and the seed are always part of it.
        comm_metrics: True (default) adds a `CommMetrics` callback, which logs the members, each one's share of
            the global batch and its measured samples/s; False: none; or a `CommMetrics(...)` of one's own.
        cluster_environment: default `ElasticEnvironment` (the launch's variables).
        The rest are Lightning's (accelerator, parallel_devices, checkpoint_io, precision_plugin, start_method)
        or DDP's (`static_graph`, `gradient_as_bucket_view`, ...; DDP's process group, `init_sync` and
        `find_unused_parameters` are the elastic package's).
    """

    strategy_name = "mccl_elastic"

    def __init__(self, settings: Optional[ElasticSettings] = None, global_batch: Optional[int] = None, seed: int = 0,
                 config: Any = None, comm_metrics: Union[bool, CommMetrics] = True,
                 cluster_environment: Optional[ClusterEnvironment] = None, **kwargs: Any) -> None:
        for name in ("compress", "process_group_backend", "ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper"):
            if kwargs.get(name) is not None:
                raise ValueError(f"{OWNER}({name}=...): not taken under elastic training (the gradients travel in "
                                 f"float32 through the elastic group's own hook)")
        if global_batch is not None and (isinstance(global_batch, bool) or not isinstance(global_batch, int)
                                         or global_batch < 1):
            raise ValueError(f"{OWNER}(global_batch={global_batch!r}): expected a positive integer")
        internals.check_checkpoint_connector()
        super().__init__(cluster_environment=cluster_environment or ElasticEnvironment(), process_group_backend=BACKEND,
                         timeout=DEFAULT_TIMEOUT, compress=None, comm_metrics_option=comm_metrics, options=None,
                         **kwargs)
        self.settings = settings or ElasticSettings()
        self.global_batch = global_batch
        self.seed = int(seed)
        self.config = config
        self.manager: Optional[ElasticManager] = None
        self.batches: Optional[ElasticBatches] = None
        self._making_batches = False
        self._started: Optional[Step] = None  # the step dealt at setup, which the first batch trains
        self._step: Optional[Step] = None  # the step being trained (or trained last)
        self._redo_batch: Any = None  # a dropped step's batch dealt again, for the closure's training_step
        self._resumed: Optional[dict] = None  # the sampler's state from the checkpoint this fit resumes
        self._failed = False

    @override
    def comm_mode(self) -> Mode:
        return Mode(DDP, None)

    @property
    def step(self) -> Optional[Step]:
        """The elastic step this member trains (or trained last): its sample ids, rank and size; a round of
        `sync_every` batches under elastic DiLoCo."""
        return self._step

    def _batches_per_step(self) -> int:
        return 1

    def _config(self, global_batch: int) -> dict:
        """What a joiner must share with the job (fingerprint.py's config)."""
        return {"user": self.config, "global_batch": global_batch, "seed": self.seed}

    # ---- who this member is ----------------------------------------------------------------------------------

    def _members(self) -> Sequence[str]:
        return self.manager.members if self.manager is not None else ()

    def _member_rank(self) -> Optional[int]:
        members = self._members()
        return list(members).index(self.manager.me) if self.manager is not None and self.manager.me in members \
            else None

    def _is_host_zero(self) -> bool:
        if self.manager is not None:
            return self.manager.me == STORE_HOST
        env = self.cluster_environment
        return not (isinstance(env, ElasticEnvironment) and env.joining) and env.global_rank() == 0

    @property
    @override
    def global_rank(self) -> int:
        """This member's rank in the group that trains the current (or the last) step (host 0: 0); before it is a
        member, the launch's (a joiner: never 0)."""
        rank = self._member_rank()
        if rank is not None:
            return rank
        return 0 if self._is_host_zero() else max(1, self.cluster_environment.global_rank())

    @property
    @override
    def world_size(self) -> int:
        """The members training the current (or the last) step (`trainer.world_size`); before the first step, the
        launch's size."""
        return len(self._members()) or self.cluster_environment.world_size()

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict:
        # The training data is dealt by the elastic sampler; any other loader (validation) is read whole.
        return {"num_replicas": 1, "rank": 0}

    @override
    def set_world_ranks(self) -> None:
        # DDPStrategy's, without MCCLBase's check of the processes per node against `devices`: a joiner's launch
        # starts its own number of processes, and the membership, not the layout, says who trains.
        DDPStrategy.set_world_ranks(self)
        rank_zero_only.rank = fabric_rank_zero_only.rank = 0 if self._is_host_zero() else 1

    # ---- set-up ----------------------------------------------------------------------------------------------

    @override
    def setup_distributed(self) -> None:
        # No default group: the members' group is the elastic manager's, made at setup once the data is known.
        self.resolve_wire()
        self.set_world_ranks()

    @override
    def setup(self, trainer: "pl.Trainer") -> None:
        if trainer.state.fn != "fit":
            raise ValueError(f"{OWNER} runs Trainer.fit; validate, test and predict with another strategy (the "
                             f"members hold the same weights, so one process can)")
        self._check_loop(trainer)
        self._making_batches = True
        try:
            trainer.fit_loop.setup_data()
        finally:
            self._making_batches = False
        if self.batches is None:
            raise ValueError(f"{OWNER}: the fit has no training data (train_dataloader)")
        sampler = ElasticSampler(len(self.batches.dataset), self.batches.global_batch, seed=self.seed)
        self.manager = ElasticManager.from_env(
            sampler, state_dict=self._training_state, load_state_dict=self._load_training_state,
            settings=self.settings, fingerprint_of=self._model_state, config=self._config(self.batches.global_batch))
        if self._resumed is not None:
            self.manager.load_state_dict(self._resumed)
        super().setup(trainer)  # the model in DDP over the manager's group (_setup_model), the optimizers
        connector = trainer._checkpoint_connector
        if connector._loaded_checkpoint:
            connector.restore_training_state()  # before this member may send it (Lightning restores it again)
        self._started = self._first_step()
        if self._started is None:
            self._stop(trainer)

    def _first_step(self) -> Optional[Step]:
        """The first step boundary: the state from host 0 (or, for a joiner, from a member)."""
        self._step = self.manager.start_step()
        return self._step

    def _check_loop(self, trainer: "pl.Trainer") -> None:
        refused = []
        if trainer.accumulate_grad_batches != 1:
            refused.append(f"accumulate_grad_batches={trainer.accumulate_grad_batches} (a step is one batch)")
        if trainer.limit_train_batches not in (1, 1.0):
            refused.append(f"limit_train_batches={trainer.limit_train_batches} (an epoch is every sample once)")
        if trainer.reload_dataloaders_every_n_epochs:
            refused.append(f"reload_dataloaders_every_n_epochs={trainer.reload_dataloaders_every_n_epochs}")
        if not self.lightning_module.automatic_optimization:
            refused.append("manual optimization (the strategy applies the optimizer step after the members' vote)")
        if refused:
            raise ValueError(f"{OWNER} cannot train with {'; '.join(refused)}")

    @override
    def process_dataloader(self, dataloader: object) -> object:
        if not self._making_batches:
            return dataloader
        trainer = self.lightning_module.trainer
        global_batch = self.global_batch
        if global_batch is None:
            if getattr(dataloader, "batch_size", None) is None:
                raise ValueError(f"{OWNER}: the training DataLoader has no batch_size; pass global_batch=")
            global_batch = dataloader.batch_size * trainer.num_nodes * trainer.num_devices
        per_step = self._batches_per_step()
        self.batches = ElasticBatches.replacing(dataloader, global_batch * per_step, self._next_step, per_step)
        return self.batches

    @override
    @internals.checked_override("lightning.pytorch.strategies.ddp", "DDPStrategy._setup_model")
    def _setup_model(self, model: torch.nn.Module) -> DistributedDataParallel:
        return elastic_ddp(model, self.manager, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)

    # ---- the state a member sends and receives ----------------------------------------------------------------

    def _training_state(self) -> dict:
        return self.lightning_module.trainer._checkpoint_connector.dump_checkpoint(weights_only=False)

    def _model_state(self) -> dict:
        return {"model": self.lightning_module.state_dict(), "optimizers": [o.state_dict() for o in self.optimizers]}

    def _load_training_state(self, checkpoint: dict) -> None:
        connector = self.lightning_module.trainer._checkpoint_connector
        connector._loaded_checkpoint = checkpoint  # Lightning's restore_training_state and resume_end follow
        connector.restore_model()
        connector.restore_datamodule()
        connector.restore_callbacks()
        connector.restore_training_state()

    @override
    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict:
        checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
        if CHECKPOINT_KEY not in checkpoint:
            raise ValueError(f"{OWNER}: the checkpoint {checkpoint_path} has no {CHECKPOINT_KEY!r} state (the elastic "
                             f"sampler's position), so it was not written by an elastic fit; resume it with the "
                             f"strategy that wrote it")
        self._resumed = checkpoint[CHECKPOINT_KEY]
        return checkpoint

    @override
    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Optional[Any] = None) -> None:
        if self.manager is not None:  # numpy arrays as tensors: torch.load(weights_only=True) takes those
            checkpoint[CHECKPOINT_KEY] = tree_map(lambda x: torch.from_numpy(x) if isinstance(x, np.ndarray) else x,
                                                  self.manager.state_dict())
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    # ---- the loop ----------------------------------------------------------------------------------------------

    def _next_step(self) -> Optional[Step]:
        """The step the next batch trains (ElasticBatches); None once this member has left the job."""
        if self._started is not None:
            step, self._started = self._started, None
            return step
        if self.manager.left:
            return None
        return self._start_step()

    def _start_step(self) -> Optional[Step]:
        """The next step dealt (`ElasticManager.start_step`); None, and the fit stopped, once this member left."""
        self._step = self.manager.start_step()
        if self._step is None:
            self._stop(self.lightning_module.trainer)
        return self._step

    def _stop(self, trainer: "pl.Trainer") -> None:
        """This member left: its fit ends after the batch it is in (whatever the minimum of epochs or steps)."""
        trainer.should_stop = True
        trainer.fit_loop.min_epochs = 0
        trainer.fit_loop.epoch_loop.min_steps = 0

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self._redo_batch is not None:
            args = (self._redo_batch, *args[1:])
        return super().training_step(*args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        """The closure (forward, backward: DDP reduces the gradients), the members' vote, and the optimizer step
        if every member's step succeeded; a dropped step is redone here with its ids dealt again."""
        result = closure()
        while not self.manager.should_commit():
            step = self._start_step()
            if step is None:  # this member left at that boundary: no optimizer step
                return None
            result = self._redo(closure, step.ids)
        return self._apply(optimizer, result, model, **kwargs)

    def _apply(self, optimizer: Any, result: Any, model: Any = None, **kwargs: Any) -> Any:
        """The optimizer step after the closure ran (its `result`): the precision plugin's, with Lightning's hooks
        before it (gradient clipping, on_before_optimizer_step)."""
        return super().optimizer_step(optimizer, lambda: result, model, **kwargs)

    def _redo(self, closure: Any, ids: Any) -> Any:
        """The closure again (training_step, backward) on the samples `ids` in place of the batch Lightning has."""
        self._redo_batch = self.batch_to_device(self.batches.batch(ids))
        try:
            return closure()
        finally:
            self._redo_batch = None

    # ---- outside the steps: no waiting for the others -----------------------------------------------------------

    @override
    def barrier(self, name: Optional[str] = None) -> None:
        """Nothing: elastic members never wait for each other outside a step."""

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj  # every member computes the same values (the same weights, the same validation data)

    @override
    def reduce(self, tensor: Any, group: Optional[Any] = None, reduce_op: Optional[Union[str, Any]] = "mean") -> Any:
        return tensor

    @override
    def all_gather(self, tensor: torch.Tensor, group: Optional[Any] = None, sync_grads: bool = False) -> torch.Tensor:
        return tensor.unsqueeze(0)

    @override
    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision

    # ---- the end -----------------------------------------------------------------------------------------------

    @override
    def on_exception(self, exception: BaseException) -> None:
        self._failed = True
        super().on_exception(exception)

    @override
    def teardown(self) -> None:
        if self.manager is not None:
            if self._failed:
                self.manager.close()
            else:
                self.manager.finish()  # host 0 serves the Store until the others are done with it
        super().teardown()


__all__ = ["MCCLElasticStrategy", "CHECKPOINT_KEY"]
