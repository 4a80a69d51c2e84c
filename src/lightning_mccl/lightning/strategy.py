"""`MCCLStrategy`: Lightning's DDP over the `mccl` backend, on Apple-silicon Macs (MPS), CPUs and GPUs.

    trainer = Trainer(strategy="mccl", num_nodes=24)                    # one process per Mac, MPS
    trainer = Trainer(strategy=MCCLStrategy(compress="bf16"), num_nodes=24)
    trainer = Trainer(strategy=MCCLStrategy(sync="diloco", sync_every=4, compress="bf16"), num_nodes=24)

It is `DDPStrategy` with `process_group_backend="mccl"`, overriding only what stops DDP on MPS in
Lightning 2.6 (`lightning.pytorch.strategies.ddp`):

- `setup_distributed`: the default group through `group.init_default_group` (shared with Fabric's strategy:
  no `device_id`, the rendezvous that names missing ranks, the wire type in its pg_options, only an mccl group
  reused, destroyed at exit; group.py says why).
- `determine_ddp_device_ids`: None unless the device is CUDA, so `_setup_model` does not enter
  `torch.cuda.stream(torch.cuda.Stream())`, which fails on a Mac without CUDA.
- `_register_ddp_hooks`: DDPStrategy registers communication hooks on CUDA only; here on every device.
- `set_world_ranks`: with $MCCL_HOSTFILE set and only Lightning's fallback `LightningEnvironment` chosen,
  uses `MacFleetEnvironment` (the hostfile's fleet) instead.
- `on_exception`: the unused-parameters hint names the mccl strategy names.
- `sync="diloco"` (outer_sync.py): `configure_ddp` leaves the model unwrapped and sets up DiLoCo, which
  `optimizer_step` drives; `on_train_end` syncs the last round; `save_checkpoint`, `load_checkpoint` and
  `remove_checkpoint` keep each rank's own part of the checkpoint.

Lightning's privates: `_init_dist_connection` (group.py), `_register_ddp_hooks` (overridden) and the
accelerator connector's MPS check (which refuses every `ParallelStrategy` instance on MPS, see `mps_gate`), all
checked at import (`internals`). The registered names (names.py) avoid "ddp", so they pass that check as they
are.
"""
from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Any, Callable, Literal, Mapping, Optional, Union

import torch
from torch.nn.parallel.distributed import DistributedDataParallel
from typing_extensions import override

import lightning.pytorch as pl
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from ..diloco import OUTER_LR, OUTER_MOMENTUM
from ..options import Options
from . import comm_metrics, mps_gate, names, outer_sync
from . import compress as _compress
from .comm_metrics import CommMetrics, comm_metrics_option
from .group import BACKEND, DEFAULT_TIMEOUT, bucket_cap_mb as _bucket_cap_mb, check_devices_per_node, fleet_environment, \
    group_timeout, init_default_group
from .internals import checked_override

log = logging.getLogger(__name__)


class MCCLStrategy(DDPStrategy):
    """DDP over `mccl`: one process per device (one per Mac on MPS), gradients all-reduced over TCP.

    Args (the rest are DDPStrategy's):
        process_group_backend: "mccl" (default). With another backend the process group is set up and kept
            as DDPStrategy does it (device_id included); device_ids, comm hooks and `compress` still work as
            described here (the tests use "gloo" this way as a reference for `compress`).
        timeout: collective timeout, a timedelta or seconds.
        compress: how gradients travel (compress.py): "bf16"/"fp16" the engine's wire compression
            (MCCL_WIRE_DTYPE, no Python hook; torch's compress hook over another backend), "bf16_hook"/
            "fp16_hook" torch's compress hooks (with `ddp_comm_hook`, its `*_compress_wrapper`), "powersgd"
            torch's PowerSGD hook with its state, "int8" the engine's 8-bit allreduce with error feedback.
        compress_options: for "powersgd", PowerSGDState arguments (default: matrix_approximation_rank 1,
            start_powerSGD_iter 10, use_error_feedback, warm_start and batch_tensors_with_same_shape True).
        find_unused_parameters, static_graph, gradient_as_bucket_view, bucket_cap_mb: passed to
            `DistributedDataParallel`, like any other keyword argument (`forward_sync_buffers`, ...).
            bucket_cap_mb defaults to group.BUCKET_CAP_MB (5) over mccl, group.POWERSGD_BUCKET_CAP_MB (1000:
            one bucket) with compress="powersgd" and group.INT8_BUCKET_CAP_MB (25) with compress="int8" over
            mccl, DDP's own (25) over other backends.
        comm_metrics: True (default) adds a `CommMetrics` callback to fits (comm/* metrics in the loggers, the
            straggler report); False turns it off; a `CommMetrics(...)` instance is used as given; anything
            else (0, "no", None) is a ValueError.
        options: the process group's settings (`lightning_mccl.Options(spin_us=0)` or a dict of MCCL_*
            variables), given to `init_process_group` as `pg_options`; they override the environment for this
            group (docs/settings.md). The wire type is `compress`'s, not an option: the strategy adds it to the
            same pg_options and never sets the environment variable.
        sync: "ddp" (default): every step's gradients all-reduced. "diloco": DiLoCo (docs/diloco.md): each rank
            trains on its own for sync_every batches, then an outer Nesterov step (outer_lr, outer_momentum;
            the defaults, 1 and 0, are plain averaging) moves the weights every rank shares by the average of
            their progress, sync_delay optimizer steps later, while training goes on; `compress` is then the
            pseudo-gradients' wire type ("bf16", "fp16", "int8"; None: float32).
    """

    strategy_name = "mccl"

    def __init__(
        self,
        accelerator: Optional["pl.accelerators.Accelerator"] = None,
        parallel_devices: Optional[list[torch.device]] = None,
        cluster_environment: Optional[ClusterEnvironment] = None,
        checkpoint_io: Optional[CheckpointIO] = None,
        precision_plugin: Optional[Precision] = None,
        ddp_comm_state: Optional[object] = None,
        ddp_comm_hook: Optional[Callable] = None,
        ddp_comm_wrapper: Optional[Callable] = None,
        model_averaging_period: Optional[int] = None,
        process_group_backend: Optional[str] = BACKEND,
        timeout: Optional[Union[timedelta, float]] = DEFAULT_TIMEOUT,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        compress: Optional[Literal["bf16", "fp16", "bf16_hook", "fp16_hook", "powersgd", "int8"]] = None,
        compress_options: Optional[dict] = None,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        bucket_cap_mb: Optional[float] = None,
        comm_metrics: Union[bool, "CommMetrics"] = True,
        options: Optional[Union[Options, Mapping[str, object]]] = None,
        sync: Literal["ddp", "diloco"] = "ddp",
        sync_every: Optional[int] = None,
        outer_lr: float = OUTER_LR,
        outer_momentum: float = OUTER_MOMENTUM,
        sync_delay: int = 1,
        **kwargs: Any,
    ) -> None:
        options = Options(options.settings if isinstance(options, Options) else options)  # checks the names
        if "MCCL_WIRE_DTYPE" in options.settings:
            raise ValueError("MCCLStrategy(options=...): MCCL_WIRE_DTYPE is chosen by compress= (\"bf16\", \"fp16\"), "
                             "not by the options")
        ddp_given = outer_sync.ddp_arguments_given(dict(
            ddp_comm_hook=ddp_comm_hook, ddp_comm_wrapper=ddp_comm_wrapper, ddp_comm_state=ddp_comm_state,
            model_averaging_period=model_averaging_period, compress_options=compress_options,
            bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters, static_graph=static_graph,
            gradient_as_bucket_view=gradient_as_bucket_view, **kwargs))
        outer = {"outer_lr": outer_lr, "outer_momentum": outer_momentum, "sync_delay": sync_delay}
        self._diloco_config = outer_sync.settings(sync, sync_every, outer, compress, ddp_given,
                                                  process_group_backend == BACKEND)
        plan = _compress.plan(None if self._diloco_config else compress, compress_options,
                              process_group_backend == BACKEND, ddp_comm_hook, ddp_comm_wrapper, ddp_comm_state)
        ddp_comm_hook, ddp_comm_wrapper, ddp_comm_state = plan.hook, plan.wrapper, plan.state
        timeout = group_timeout(timeout, "MCCLStrategy")
        kwargs.update(
            find_unused_parameters=find_unused_parameters,
            static_graph=static_graph,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
        if not self._diloco_config:
            bucket_cap_mb = _bucket_cap_mb(bucket_cap_mb, process_group_backend, compress)
        if bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = bucket_cap_mb
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            ddp_comm_state=ddp_comm_state,
            ddp_comm_hook=ddp_comm_hook,
            ddp_comm_wrapper=ddp_comm_wrapper,
            model_averaging_period=model_averaging_period,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **kwargs,
        )
        self.compress = compress
        self.compress_options = plan.options
        self._compress_plan = plan
        self.comm_metrics = comm_metrics_option(comm_metrics)
        self.options = options
        self.sync, self.sync_every = sync, sync_every
        self.outer_lr, self.outer_momentum, self.sync_delay = outer_lr, outer_momentum, sync_delay
        self._outer: Optional[outer_sync.OuterSync] = None  # DiLoCo during a fit
        self._outer_resume: Optional[dict] = None  # its state from the checkpoint being resumed

    @property
    def diloco(self) -> Optional["lightning_mccl.diloco.DiLoCo"]:  # noqa: F821
        """During a fit with sync="diloco": its `lightning_mccl.diloco.DiLoCo` (anchor, rounds, ...); else None."""
        return self._outer.diloco if self._outer is not None else None

    @property
    def outer_group(self) -> Optional[Any]:
        """During a fit with sync="diloco": the process group of its outer allreduce (for
        `lightning_mccl.stats(group)`); else None."""
        return self._outer.group if self._outer is not None else None

    def _uses_mccl(self) -> bool:
        return self._get_process_group_backend() == BACKEND

    @override
    def set_world_ranks(self) -> None:
        self.cluster_environment = fleet_environment(self.cluster_environment)  # $MCCL_HOSTFILE's fleet
        check_devices_per_node(self.num_processes, self.num_nodes)
        super().set_world_ranks()

    @override
    def setup_distributed(self) -> None:
        if not self._uses_mccl():
            super().setup_distributed()
            return
        log.debug(f"{self.__class__.__name__}: setting up distributed...")
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = BACKEND
        assert self.cluster_environment is not None
        self._choose_compression()
        init_default_group("MCCLStrategy", self.cluster_environment, self._timeout, self._group_settings)

    def _group_settings(self, existing: Optional[str]) -> dict:
        # The wire type travels in the new group's pg_options (read when the group is made), never in the
        # environment; a group Lightning reuses must already have it (compress.wire_settings).
        return {**self.options.settings, **_compress.wire_settings(self._compress_plan.wire, existing)}

    def _choose_compression(self) -> None:
        # compress="bf16"/"fp16": the engine narrows CPU gradients on the wire; on an accelerator torch's hook
        # narrows them on the device, before staging (compress.py says why, with the measurement).
        plan = self._compress_plan
        if plan.wire and plan.on_accelerator is not None and self.root_device.type != "cpu":
            plan = self._compress_plan = plan.on_accelerator
            self._ddp_comm_hook, self._ddp_comm_wrapper, self._ddp_comm_state = plan.hook, plan.wrapper, plan.state

    @override
    def setup(self, trainer: "pl.Trainer") -> None:
        comm_metrics.attach(trainer, self.comm_metrics)
        super().setup(trainer)
        if self._outer is not None:
            outer_sync.check_optimizers(self.optimizers)

    @override
    def configure_ddp(self) -> None:
        if self._diloco_config is None:
            super().configure_ddp()
            return
        module = self.lightning_module
        self._outer = outer_sync.OuterSync(self._diloco_config, module, module.trainer, self._layer_sync,
                                           self._get_process_group_backend(), self.options.settings,
                                           self._outer_resume)
        self._outer_resume = None

    @override
    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        output = super().optimizer_step(*args, **kwargs)
        if self._outer is not None:
            self._outer.diloco.step()
        return output

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        if self._outer is not None:
            self._outer.finish()
            self._outer = None

    @override
    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Optional[Any] = None) -> None:
        own = None
        if self._outer is not None and "optimizer_states" in checkpoint:  # not for weights-only checkpoints
            own = self._outer.save(checkpoint, self.global_rank)
        if own is not None:
            self.checkpoint_io.save_checkpoint(own, outer_sync.own_file(filepath, self.global_rank))
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict:
        checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
        if self._diloco_config is not None:
            self._outer_resume = outer_sync.resume_state(checkpoint, checkpoint_path, self.global_rank,
                                                         self.checkpoint_io)
        return checkpoint

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        super().remove_checkpoint(filepath)
        if self._diloco_config is not None and self.global_rank != 0:
            self.checkpoint_io.remove_checkpoint(outer_sync.own_file(filepath, self.global_rank))

    @override
    def teardown(self) -> None:
        super().teardown()
        self._outer = None  # after an exception its group is left to the exit hook
        self._outer_resume = None  # read by a validate/test that loaded a DiLoCo checkpoint

    @override
    def determine_ddp_device_ids(self) -> Optional[list[int]]:
        if self.root_device.type != "cuda":
            return None  # DDPStrategy returns [index] for MPS, which makes _setup_model create a CUDA stream
        return [self.root_device.index]

    @override
    @checked_override("lightning.pytorch.strategies.ddp", "DDPStrategy._register_ddp_hooks")
    def _register_ddp_hooks(self) -> None:
        # DDPStrategy registers hooks only when the root device is CUDA; DDP runs them on any device.
        assert isinstance(self.model, DistributedDataParallel)
        hook = self._ddp_comm_hook
        if self._compress_plan.check is not None:
            self._compress_plan.check(self.model.module)
        if hook is None:
            return
        if self._ddp_comm_wrapper is not None:
            hook = self._ddp_comm_wrapper(hook)
        self.model.register_comm_hook(state=self._ddp_comm_state, hook=hook)

    @override
    def on_exception(self, exception: BaseException) -> None:
        # DDPStrategy's hint names strategy='ddp_find_unused_parameters_true': the same hint, with our names.
        pattern = re.compile(".*Expected to have finished reduction in the prior iteration.*", re.DOTALL)
        hint = ("It looks like your LightningModule has parameters that were not used in producing the loss returned"
                " by training_step. If this is intentional, enable the detection of unused parameters in DDP with"
                " `strategy='mccl_find_unused_parameters_true'`"
                " or `strategy=MCCLStrategy(find_unused_parameters=True)`.")
        exception.args = tuple(hint if isinstance(a, str) and pattern.match(a) else a for a in exception.args)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        names.register(strategy_registry, cls, names.TRAINER)


MCCLStrategy.register_strategies(StrategyRegistry)
mps_gate.install(MCCLStrategy)
