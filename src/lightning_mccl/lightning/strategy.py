"""`MCCLStrategy`: Lightning's DDP over the `mccl` backend, on Apple-silicon Macs (MPS), CPUs and GPUs.

    trainer = Trainer(strategy="mccl", num_nodes=24)                    # one process per Mac, MPS
    trainer = Trainer(strategy=MCCLStrategy(compress="bf16"), num_nodes=24)

It is `DDPStrategy` with `process_group_backend="mccl"` and what every mccl strategy overrides (base.py), plus:

- `compress`: how gradients travel, one row of the wire policy (wire_policy.py), resolved at setup; the DDP
  comm hook it needs is built from that resolution (hooks.py).
- `configure_ddp`: DDP's bucket size is the resolution's unless `bucket_cap_mb` is given.
- `_register_ddp_hooks`: DDPStrategy registers communication hooks on CUDA only; here on every device.
- `on_exception`: the unused-parameters hint names the mccl strategy names.

DiLoCo, which does not wrap the model in DDP at all, is its own strategy: `MCCLDiLoCoStrategy`
(diloco_strategy.py, "mccl_diloco").
"""
from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Callable, Literal, Mapping, Optional, Union

import torch
from torch.nn.parallel.distributed import DistributedDataParallel
from typing_extensions import override

import lightning.pytorch as pl
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.pytorch.plugins.precision import Precision

from ..accuracy_costs import DDP, Mode
from ..options import Options
from ..wire_policy import POWERSGD, Compress
from . import hooks
from .base import MCCLBase
from .comm_metrics import CommMetrics
from .group import BACKEND, DEFAULT_TIMEOUT
from .internals import checked_override


class MCCLStrategy(MCCLBase):
    """DDP over `mccl`: one process per device (one per Mac on MPS), gradients all-reduced over TCP.

    Args (the rest are DDPStrategy's):
        process_group_backend: "mccl" (default). With another backend the process group is set up and kept
            as DDPStrategy does it (device_id included); device_ids, comm hooks and `compress` still work as
            described here (the tests use "gloo" this way as a reference for `compress`).
        timeout: collective timeout, a timedelta or seconds.
        compress: how gradients travel (the wire policy's table, wire_policy.py; docs/settings.md): "bf16"/"fp16"
            16-bit (the engine's wire compression on the CPU, torch's compress hook cast on the device on an
            accelerator), "bf16_hook"/"fp16_hook" torch's compress hooks (with `ddp_comm_hook`, its
            `*_compress_wrapper`), "powersgd" torch's PowerSGD hook with its state, "int8" the engine's 8-bit
            allreduce with error feedback. None: float32.
        compress_options: for "powersgd", PowerSGDState arguments (default: matrix_approximation_rank 1,
            start_powerSGD_iter 10, use_error_feedback, warm_start and batch_tensors_with_same_shape True).
        find_unused_parameters, static_graph, gradient_as_bucket_view, bucket_cap_mb: passed to
            `DistributedDataParallel`, like any other keyword argument (`forward_sync_buffers`, ...).
            bucket_cap_mb defaults to the wire policy's over mccl (5 MB; one bucket for "powersgd", 25 MB for
            "int8"), DDP's own (25) over other backends.
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
        compress: Optional[Compress] = None,
        compress_options: Optional[dict] = None,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        bucket_cap_mb: Optional[float] = None,
        comm_metrics: Union[bool, "CommMetrics"] = True,
        options: Optional[Union[Options, Mapping[str, object]]] = None,
        **kwargs: Any,
    ) -> None:
        self.compress_options = hooks.check("MCCLStrategy", compress, compress_options, process_group_backend,
                                            ddp_comm_hook, ddp_comm_wrapper, ddp_comm_state)
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
            compress=compress,
            comm_metrics_option=comm_metrics,
            options=options,
            find_unused_parameters=find_unused_parameters,
            static_graph=static_graph,
            gradient_as_bucket_view=gradient_as_bucket_view,
            **kwargs,
        )
        self._given_hook = (ddp_comm_hook, ddp_comm_wrapper, ddp_comm_state)  # the user's, which compress may wrap
        self._hook: Optional[hooks.Hook] = None  # built at setup from the resolution

    @override
    def comm_mode(self) -> Mode:
        rank = self.compress_options.get("matrix_approximation_rank") if self.compress == POWERSGD else None
        return Mode(DDP, self.compress, powersgd_rank=rank)

    @override
    def resolve_wire(self) -> None:
        super().resolve_wire()
        self._hook = hooks.build("MCCLStrategy", self.wire, self.compress_options, *self._given_hook)
        self._ddp_comm_hook, self._ddp_comm_wrapper, self._ddp_comm_state = (
            self._hook.hook, self._hook.wrapper, self._hook.state)

    @override
    def configure_ddp(self) -> None:
        if self.wire.bucket_mb is not None:
            self._ddp_kwargs.setdefault("bucket_cap_mb", self.wire.bucket_mb)
        super().configure_ddp()

    @override
    @checked_override("lightning.pytorch.strategies.ddp", "DDPStrategy._register_ddp_hooks")
    def _register_ddp_hooks(self) -> None:
        # DDPStrategy registers hooks only when the root device is CUDA; DDP runs them on any device.
        assert isinstance(self.model, DistributedDataParallel)
        if self._hook.check is not None:
            self._hook.check(self.model.module)
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
