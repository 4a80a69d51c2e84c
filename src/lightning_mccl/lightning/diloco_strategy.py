"""`MCCLDiLoCoStrategy` ("mccl_diloco"): DiLoCo in a Lightning Trainer (docs/diloco.md).

    trainer = Trainer(strategy="mccl_diloco", num_nodes=24)
    trainer = Trainer(strategy=MCCLDiLoCoStrategy(sync_every=4, compress="bf16"), num_nodes=24)

Each rank trains on its own for `sync_every` optimizer steps (a round), then the weights every rank shares move
by the average of their progress (an outer optimizer step), `sync_delay` optimizer steps later, while training
goes on (diloco/outer.py has the outer step, diloco/schedule.py the schedule and the options for short jobs).
The model is not wrapped in DDP, so no step allreduces a gradient, and the strategy takes none of DDP's
arguments. What it shares with `MCCLStrategy` (the group, the fleet environment,
MPS, CommMetrics) is base.py's; the fit's outer group, DiLoCo object and checkpoint files are outer_sync.py's.

The unit of `sync_every` and `sync_delay` is the inner optimizer's steps (`Trainer(accumulate_grad_batches=k)`
makes k batches one step). DiLoCo counts them on the optimizer's step post-hook, so a LightningModule has one
optimizer, and a gradient scaler (precision="16-mixed"), which skips one rank's step on an overflow, is refused.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal, Mapping, Optional, Union

import torch
from typing_extensions import override

import lightning.pytorch as pl
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.pytorch.plugins.precision import Precision

from ..accuracy_costs import DILOCO, Mode
from ..diloco.outer import DiLoCo, OuterOptimizer
from ..diloco.settings import (FRAGMENTS, MAX_SYNC_EVERY, OUTER_LR, OUTER_MOMENTUM, QSR_ALPHA, SYNC_DELAY,
                               SYNC_EVERY, WARM_START, check_schedule, check_settings)
from ..options import Options
from ..wire_policy import DiLoCoCompress
from . import outer_sync
from .base import MCCLBase
from .comm_metrics import CommMetrics
from .group import BACKEND, DEFAULT_TIMEOUT


class MCCLDiLoCoStrategy(MCCLBase):
    """DiLoCo over `mccl`: one process per device (one per Mac on MPS), an outer sync every `sync_every` steps.

    Args:
        sync_every: inner optimizer steps per round (H; default 3, docs/diloco.md says why).
        sync_delay: inner optimizer steps between a round's end and its outer step (tau), 1 to sync_every: the
            time the outer allreduce has to run while training goes on.
        outer_lr, outer_momentum: the default outer optimizer's learning rate and Nesterov momentum (defaults 1
            and 0: plain averaging of the ranks' progress).
        outer_optimizer: instead, a function that makes the outer optimizer from a list of tensors (the
            anchor, shaped as the parameters; one per fragment), e.g. `functools.partial(torch.optim.SGD, lr=0.7,
            momentum=0.9, nesterov=True)`; LightningCLI takes it as a class_path with init_args.
        warm_start: the first optimizer steps synchronous (each rank's progress averaged after every step);
            default 0.
        fragments: the parameters in this many parts, each synced on its own step of the round (Streaming
            DiLoCo: each allreduce about 1/fragments of the model); default "auto": min(sync_every, the model's
            trainable parameter tensors), a fragment a step, or, resuming, the checkpoint's count. 1: the whole
            model at the round's end.
        qsr_alpha, max_sync_every: the H schedule: H = max(sync_every, floor((qsr_alpha / lr)^2)) once the
            optimizer's learning rate falls below its peak, at most max_sync_every (needed); default None (off).
        compress: how the pseudo-gradients travel (wire_policy.py): "bf16"/"fp16" (the engine narrows on the wire
            on the CPU, cast on the device on an accelerator), "int8" (the 8-bit allreduce with error feedback),
            None (float32).
        process_group_backend, timeout, options, comm_metrics: as `MCCLStrategy`'s.
    """

    strategy_name = "mccl_diloco"
    diloco_compress = True

    def __init__(  # DiLoCo's own arguments first, then the process group's, then what Lightning passes in
        self,
        sync_every: int = SYNC_EVERY,
        sync_delay: int = SYNC_DELAY,
        outer_lr: float = OUTER_LR,
        outer_momentum: float = OUTER_MOMENTUM,
        outer_optimizer: Optional[OuterOptimizer] = None,
        warm_start: int = WARM_START,
        fragments: Union[int, str] = FRAGMENTS,
        qsr_alpha: Optional[float] = QSR_ALPHA,
        max_sync_every: Optional[int] = MAX_SYNC_EVERY,
        compress: Optional[DiLoCoCompress] = None,
        comm_metrics: Union[bool, "CommMetrics"] = True,
        options: Optional[Union[Options, Mapping[str, object]]] = None,
        process_group_backend: Optional[str] = BACKEND,
        timeout: Optional[Union[timedelta, float]] = DEFAULT_TIMEOUT,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        accelerator: Optional["pl.accelerators.Accelerator"] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
    ) -> None:
        check_settings(sync_every, outer_lr, outer_momentum, sync_delay, type(self).__name__)
        check_schedule(sync_every, warm_start, fragments, qsr_alpha, max_sync_every, type(self).__name__)
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method, compress=compress,
                         comm_metrics_option=comm_metrics, options=options)
        self.sync_every, self.sync_delay = sync_every, sync_delay
        self.outer_lr, self.outer_momentum, self.outer_optimizer = outer_lr, outer_momentum, outer_optimizer
        self.warm_start, self.fragments = warm_start, fragments
        self.qsr_alpha, self.max_sync_every = qsr_alpha, max_sync_every
        self._outer: Optional[outer_sync.OuterSync] = None  # during a fit
        self._resume: Optional[dict] = None  # DiLoCo's state from the checkpoint being resumed

    @property
    def diloco(self) -> Optional[DiLoCo]:
        """During a fit: its `lightning_mccl.diloco.DiLoCo` (anchor, rounds, ...); else None."""
        return self._outer.diloco if self._outer is not None else None

    @property
    def outer_group(self) -> Optional[Any]:
        """During a fit: the process group of its outer allreduce (for `lightning_mccl.stats(group)`); else None."""
        return self._outer.group if self._outer is not None else None

    @override
    def comm_mode(self) -> Mode:
        """During a fit (CommMetrics asks at its start): its fragments are the DiLoCo object's count, "auto"
        resolved against the model (or a resumed checkpoint's)."""
        plain = self.outer_optimizer is None and (self.outer_lr, self.outer_momentum) == (OUTER_LR, OUTER_MOMENTUM)
        return Mode(DILOCO, self.compress, sync_every=self.sync_every, sync_delay=self.sync_delay,
                    plain_averaging=plain, fragments=self.diloco.fragments)

    @override
    def configure_ddp(self) -> None:
        # No DDP: each rank trains on its own between outer syncs.
        self._outer = outer_sync.OuterSync(
            type(self).__name__, self.wire, self.lightning_module, self._get_process_group_backend(),
            self.options.settings, self._resume, sync_every=self.sync_every, sync_delay=self.sync_delay,
            outer_lr=self.outer_lr, outer_momentum=self.outer_momentum, outer_optimizer=self.outer_optimizer,
            warm_start=self.warm_start, fragments=self.fragments, qsr_alpha=self.qsr_alpha,
            max_sync_every=self.max_sync_every)
        self._resume = None

    @override
    def setup(self, trainer: "pl.Trainer") -> None:
        super().setup(trainer)
        if self._outer is not None:
            outer_sync.check_fit(type(self).__name__, self.optimizers, self._layer_sync, self.precision_plugin)
            self._outer.diloco.attach(self.optimizers[0])

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        if self._outer is not None:
            self._outer.finish()
            self._outer = None

    @override
    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Optional[Any] = None) -> None:
        if self._outer is not None and "optimizer_states" in checkpoint:  # not for weights-only checkpoints
            own = self._outer.save(checkpoint, self.global_rank)
            if own is not None:
                self.checkpoint_io.save_checkpoint(own, outer_sync.own_file(filepath, self.global_rank))
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict:
        checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
        self._resume = outer_sync.resume_state(checkpoint, checkpoint_path, self.global_rank, self.checkpoint_io)
        return checkpoint

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        super().remove_checkpoint(filepath)
        if self.global_rank != 0:
            self.checkpoint_io.remove_checkpoint(outer_sync.own_file(filepath, self.global_rank))

    @override
    def teardown(self) -> None:
        super().teardown()
        if self._outer is not None:  # after an exception its group is left to the exit hook
            self._outer.diloco.detach()
            self._outer = None
        self._resume = None  # read by a validate/test that loaded a DiLoCo checkpoint
