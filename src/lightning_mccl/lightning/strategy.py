"""`MCCLStrategy`: Lightning's DDP over the `mccl` backend, on Apple-silicon Macs (MPS), CPUs and GPUs.

    trainer = Trainer(strategy="mccl", num_nodes=24)                    # one process per Mac, MPS
    trainer = Trainer(strategy=MCCLStrategy(compress="bf16"), num_nodes=24)

It is `DDPStrategy` with `process_group_backend="mccl"`, overriding only what stops DDP on MPS in
Lightning 2.6 (`lightning.pytorch.strategies.ddp`):

- `setup_distributed`: no `device_id` for the mccl group. Lightning binds the default group to the root
  device when it is not a CPU; every later group inherits that binding (torch `_new_group_with_tag`), so the
  Gloo group of Lightning's own `_InfiniteBarrier` would be bound to MPS, where Gloo cannot run.
- `determine_ddp_device_ids`: None unless the device is CUDA, so `_setup_model` does not enter
  `torch.cuda.stream(torch.cuda.Stream())`, which fails on a Mac without CUDA.
- `_register_ddp_hooks`: DDPStrategy registers communication hooks on CUDA only; here on every device.
- `setup_distributed` also has the group it created destroyed at interpreter exit, as Lightning does for
  NCCL only (`_init_dist_connection`); Gloo and mccl groups were otherwise never destroyed. Not in
  `teardown`: a second fit/test in the same script would then re-initialise on the same MASTER_PORT while
  rank 0's old TCPStore may still be up, and a rank can reach that old store ("Connection reset by peer" in
  TCPStore.waitForWorkers, seen once in about 80 re-initialisations here). Kept for the process's lifetime,
  the group is reused by later fits, as Lightning's DDP reuses its own.
- `set_world_ranks`: with $MCCL_HOSTFILE set and only Lightning's fallback `LightningEnvironment` chosen,
  uses `MacFleetEnvironment` (the hostfile's fleet) instead.
- `on_exception`: the unused-parameters hint names the mccl strategy names.

The accelerator connector refuses any `ParallelStrategy` *instance* (and any strategy name containing
"ddp") together with an MPS accelerator (`_AcceleratorConnector._check_config_and_set_final_flags`). The
registered names below avoid "ddp"; for instances (`strategy=MCCLStrategy(...)`, LightningCLI `class_path`)
`_open_mps_gate` lets that one check pass for `MCCLStrategy` and for nothing else.
"""
from __future__ import annotations

import atexit
import logging
from datetime import timedelta
from typing import Any, Callable, Literal, Optional, Union

import torch
import torch.distributed
from torch.nn.parallel.distributed import DistributedDataParallel
from typing_extensions import override

import lightning.pytorch as pl
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.distributed import _destroy_dist_connection, _init_dist_connection
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.connectors import accelerator_connector as _connector
from lightning.pytorch.utilities.exceptions import _augment_message

from .. import _backend  # importing the lightning_mccl package registered the "mccl" backend
from . import comm_metrics
from .comm_metrics import CommMetrics
from .mps_gate import open_mps_gate

log = logging.getLogger(__name__)

BACKEND = _backend.BACKEND_NAME
COMPRESS_CHOICES = ("bf16", "fp16")


def _compress_hooks(compress: str) -> tuple:
    """(hook, wrapper) of torch's default_hooks for `compress`."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if compress == "bf16":
        return default_hooks.bf16_compress_hook, default_hooks.bf16_compress_wrapper
    return default_hooks.fp16_compress_hook, default_hooks.fp16_compress_wrapper


class MCCLStrategy(DDPStrategy):
    """DDP over `mccl`: one process per device (one per Mac on MPS), gradients all-reduced over TCP.

    Args (the rest are DDPStrategy's):
        process_group_backend: "mccl" (default). With another backend the process group is set up and kept
            as DDPStrategy does it (device_id included); device_ids, comm hooks and `compress` still work as
            described here (the tests use "gloo" this way as a reference for `compress`).
        timeout: collective timeout, a timedelta or seconds.
        compress: "bf16" or "fp16" sends gradients in that half type (torch's `bf16_compress_hook` /
            `fp16_compress_hook`); with `ddp_comm_hook` also given, the matching `*_compress_wrapper` wraps it.
        find_unused_parameters, static_graph, gradient_as_bucket_view, bucket_cap_mb: passed to
            `DistributedDataParallel`, like any other keyword argument (`forward_sync_buffers`, ...).
        comm_metrics: True (default) adds a `CommMetrics` callback to fits (comm/* metrics in the loggers, the
            straggler report); False turns it off; a `CommMetrics(...)` instance is used as given.
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
        timeout: Optional[Union[timedelta, float]] = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        compress: Optional[Literal["bf16", "fp16"]] = None,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        bucket_cap_mb: Optional[float] = None,
        comm_metrics: Union[bool, "CommMetrics"] = True,
        **kwargs: Any,
    ) -> None:
        if compress is not None:
            if compress not in COMPRESS_CHOICES:
                raise ValueError(f"MCCLStrategy(compress={compress!r}): expected one of {COMPRESS_CHOICES} or None")
            hook, wrapper = _compress_hooks(compress)
            if ddp_comm_hook is None:
                ddp_comm_hook = hook
            elif ddp_comm_wrapper is not None:
                raise ValueError(
                    f"MCCLStrategy(compress={compress!r}) with both ddp_comm_hook and ddp_comm_wrapper: compress"
                    " would replace the wrapper; give either compress or ddp_comm_wrapper"
                )
            else:
                ddp_comm_wrapper = wrapper
        if timeout is not None and not isinstance(timeout, timedelta):
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ValueError(
                    f"MCCLStrategy(timeout={timeout!r}): expected a timedelta or a positive number of seconds"
                )
            timeout = timedelta(seconds=timeout)
        kwargs.update(
            find_unused_parameters=find_unused_parameters,
            static_graph=static_graph,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
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
        self.comm_metrics = comm_metrics

    def _uses_mccl(self) -> bool:
        return self._get_process_group_backend() == BACKEND

    @override
    def set_world_ranks(self) -> None:
        # A fleet described by $MCCL_HOSTFILE replaces Lightning's fallback environment (never one the user chose
        # or that Lightning detected, such as torchrun's or SLURM's).
        if type(self.cluster_environment) is LightningEnvironment:
            from .environment import MacFleetEnvironment

            if MacFleetEnvironment.detect():
                self.cluster_environment = MacFleetEnvironment()
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
        created = not torch.distributed.is_initialized()
        # No device_id: MCCL needs no device binding, and a bound default group binds every later group too.
        _init_dist_connection(self.cluster_environment, BACKEND, timeout=self._timeout)
        if created:
            _destroy_at_exit()

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
    def _register_ddp_hooks(self) -> None:
        # DDPStrategy registers hooks only when the root device is CUDA; DDP runs them on any device.
        assert isinstance(self.model, DistributedDataParallel)
        _register_ddp_comm_hook(
            model=self.model,
            ddp_comm_state=self._ddp_comm_state,
            ddp_comm_hook=self._ddp_comm_hook,
            ddp_comm_wrapper=self._ddp_comm_wrapper,
        )

    @override
    def on_exception(self, exception: BaseException) -> None:
        _augment_message(
            exception,
            pattern=".*Expected to have finished reduction in the prior iteration.*",
            new_message=(
                "It looks like your LightningModule has parameters that were not used in producing the loss returned"
                " by training_step. If this is intentional, enable the detection of unused parameters in DDP with"
                " `strategy='mccl_find_unused_parameters_true'`"
                " or `strategy=MCCLStrategy(find_unused_parameters=True)`."
            ),
        )

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """The names of DDPStrategy's registrations with "ddp" replaced by "mccl" (no fork variants: Metal does
        not survive fork()), and one per gradient compression."""
        for name, start_method in (("mccl", "popen"), ("mccl_spawn", "spawn")):
            strategy_registry.register(
                name,
                cls,
                description=f"DDP over mccl with `start_method` '{start_method}'",
                override=True,
                start_method=start_method,
            )
            for fup in (False, True):
                strategy_registry.register(
                    f"{name}_find_unused_parameters_{str(fup).lower()}",
                    cls,
                    description=f"DDP over mccl with `find_unused_parameters` as {fup}"
                    f" and `start_method` '{start_method}'",
                    override=True,
                    find_unused_parameters=fup,
                    start_method=start_method,
                )
        for compress in COMPRESS_CHOICES:
            strategy_registry.register(
                f"mccl_{compress}_compress",
                cls,
                description=f"DDP over mccl, gradients all-reduced in {compress}",
                override=True,
                compress=compress,
            )


_destroy_registered = False


def _destroy_at_exit() -> None:
    """Once per process: destroy the default group at exit (Lightning's own handler, which ignores Ctrl+C
    meanwhile), before interpreter shutdown tears down the objects the engine's threads use."""
    global _destroy_registered
    if not _destroy_registered:
        atexit.register(_destroy_dist_connection)
        _destroy_registered = True


def _open_mps_gate() -> None:
    """Lets `MCCLStrategy` instances through the Trainer connector's MPS check (mps_gate.py)."""
    open_mps_gate(_connector, _connector._AcceleratorConnector, MCCLStrategy)


MCCLStrategy.register_strategies(StrategyRegistry)
_open_mps_gate()
