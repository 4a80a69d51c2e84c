"""`MCCLStrategy`: Lightning's DDP over the `mccl` backend, on Apple-silicon Macs (MPS), CPUs and GPUs.

    trainer = Trainer(strategy="mccl", num_nodes=24)                    # one process per Mac, MPS
    trainer = Trainer(strategy=MCCLStrategy(compress="bf16"), num_nodes=24)

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

from ..options import Options
from . import comm_metrics, mps_gate, names
from . import compress as _compress
from .comm_metrics import CommMetrics, comm_metrics_option
from .group import BACKEND, DEFAULT_TIMEOUT, bucket_cap_mb as _bucket_cap_mb, fleet_environment, group_timeout, \
    init_default_group
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
            torch's PowerSGD hook with its state.
        compress_options: for "powersgd", PowerSGDState arguments (default: matrix_approximation_rank 1,
            start_powerSGD_iter 10, use_error_feedback, warm_start and batch_tensors_with_same_shape True).
        find_unused_parameters, static_graph, gradient_as_bucket_view, bucket_cap_mb: passed to
            `DistributedDataParallel`, like any other keyword argument (`forward_sync_buffers`, ...).
            bucket_cap_mb defaults to group.BUCKET_CAP_MB (5) over mccl, group.POWERSGD_BUCKET_CAP_MB (1000:
            one bucket) with compress="powersgd" over mccl, DDP's own (25) over other backends.
        comm_metrics: True (default) adds a `CommMetrics` callback to fits (comm/* metrics in the loggers, the
            straggler report); False turns it off; a `CommMetrics(...)` instance is used as given; anything
            else (0, "no", None) is a ValueError.
        options: the process group's settings (`lightning_mccl.Options(spin_us=0)` or a dict of MCCL_*
            variables), given to `init_process_group` as `pg_options`; they override the environment for this
            group (docs/settings.md). The wire type is `compress`'s, not an option: the strategy adds it to the
            same pg_options and never sets the environment variable.
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
        compress: Optional[Literal["bf16", "fp16", "bf16_hook", "fp16_hook", "powersgd"]] = None,
        compress_options: Optional[dict] = None,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        bucket_cap_mb: Optional[float] = None,
        comm_metrics: Union[bool, "CommMetrics"] = True,
        options: Optional[Union[Options, Mapping[str, object]]] = None,
        **kwargs: Any,
    ) -> None:
        options = Options(options.settings if isinstance(options, Options) else options)  # checks the names
        if "MCCL_WIRE_DTYPE" in options.settings:
            raise ValueError("MCCLStrategy(options=...): MCCL_WIRE_DTYPE is chosen by compress= (\"bf16\", \"fp16\"), "
                             "not by the options")
        plan = _compress.plan(compress, compress_options, process_group_backend == BACKEND, ddp_comm_hook,
                              ddp_comm_wrapper, ddp_comm_state)
        ddp_comm_hook, ddp_comm_wrapper, ddp_comm_state = plan.hook, plan.wrapper, plan.state
        timeout = group_timeout(timeout, "MCCLStrategy")
        kwargs.update(
            find_unused_parameters=find_unused_parameters,
            static_graph=static_graph,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
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

    def _uses_mccl(self) -> bool:
        return self._get_process_group_backend() == BACKEND

    @override
    def set_world_ranks(self) -> None:
        self.cluster_environment = fleet_environment(self.cluster_environment)  # $MCCL_HOSTFILE's fleet
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
