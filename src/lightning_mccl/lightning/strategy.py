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
  the group is reused by later fits, as Lightning's DDP reuses its own. A default group that exists over
  another backend is refused (ValueError): Lightning would return early and train on it.
- `setup_distributed` rendezvouses through `lightning_mccl.rendezvous` (torch's TCPStore, waiting in Python):
  ranks that have not arrived are named every few seconds, and after the group timeout in the error.
- `set_world_ranks`: with $MCCL_HOSTFILE set and only Lightning's fallback `LightningEnvironment` chosen,
  uses `MacFleetEnvironment` (the hostfile's fleet) instead.
- `on_exception`: the unused-parameters hint names the mccl strategy names.

Lightning's privates: `_init_dist_connection` (above), `_register_ddp_hooks` (overridden) and the accelerator
connector's MPS check (which refuses every `ParallelStrategy` instance on MPS, see `mps_gate`), all checked
at import (`internals`).
The registered names avoid "ddp", so they pass that check as they are.
"""
from __future__ import annotations

import atexit
import logging
import re
import signal
import threading
from datetime import timedelta
from typing import Any, Callable, Literal, Mapping, Optional, Union

import torch
import torch.distributed
from torch.nn.parallel.distributed import DistributedDataParallel
from typing_extensions import override

import lightning.pytorch as pl
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

from .. import _backend  # importing the lightning_mccl package registered the "mccl" backend
from ..options import Options
from . import compress as _compress
from . import mps_gate
from .internals import checked, checked_override

_init_dist_connection = checked("lightning.fabric.utilities.distributed", "_init_dist_connection",
                                ("cluster_environment", "torch_distributed_backend"))
from . import comm_metrics
from .comm_metrics import CommMetrics, comm_metrics_option

log = logging.getLogger(__name__)

BACKEND = _backend.BACKEND_NAME
COMPRESS_CHOICES = _compress.CHOICES
# DDP's bucket size over mccl when bucket_cap_mb is not given. On the 8-host fleet stand-in (ViT-B/16,
# 10 Gbit/s) 5 MB buckets beat DDP's 25 MB at batch 32 in four runs of five (842 against 879 ms a step), and
# at batch 8 by 2-5% once the emulated hosts ran cubic instead of BBR's slow mode (docs/performance.md, "DDP
# settings for fleets" and "The stand-in on cubic"). The last bucket's allreduce, the one left after the backward pass, is a
# fifth as long. Gloo's per-collective cost makes small buckets slower there (1447 and 753 ms), so other
# backends keep DDP's default.
MCCL_BUCKET_CAP_MB = 5.0
# The same for compress="powersgd": one bucket (DDP still makes its first, 1 MB one), so the hook's chain of
# allreduces and matrix work runs once, after the backward pass, instead of once per bucket, one bucket after
# another. Same stand-in, batch 8: 358 ms a step against 388 ms with 100 MB buckets and 536 ms with 5 MB (one
# run; 426 ms with 25 MB in an earlier one). The buckets' memory is the gradients' either way.
POWERSGD_BUCKET_CAP_MB = 1000.0


def group_timeout(timeout: Optional[Union[timedelta, float]], owner: str) -> Optional[timedelta]:
    """A strategy's `timeout` argument as the process group's timedelta (None stays None); ValueError naming
    `owner` for anything but a timedelta or a positive number of seconds."""
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"{owner}(timeout={timeout!r}): expected a timedelta or a positive number of seconds")
    return timedelta(seconds=timeout)


def fleet_environment(env: Optional[ClusterEnvironment]) -> Optional[ClusterEnvironment]:
    """The cluster environment of the mccl strategies (Trainer's and Fabric's): a `MacFleetEnvironment` when
    $MCCL_HOSTFILE names the fleet and `env` is only Lightning's fallback `LightningEnvironment`, else `env`
    (one the user chose or that Lightning detected, such as torchrun's or SLURM's)."""
    if type(env) is not LightningEnvironment:
        return env
    from .environment import MacFleetEnvironment  # here: importing it imports Lightning, which imports this module

    return MacFleetEnvironment() if MacFleetEnvironment.detect() else env


def require_mccl_default_group(owner: str) -> None:
    """A default group exists, which Lightning's _init_dist_connection then reuses without a word: it must be
    an mccl one, or the fit would run over another backend. ValueError naming it otherwise."""
    backend = torch.distributed.get_backend()
    if backend != BACKEND:
        raise ValueError(f"{owner}: the default process group that already exists runs {backend!r}, not mccl: "
                         f"destroy it first (torch.distributed.destroy_process_group()) or use "
                         f"process_group_backend={backend!r}")


def rendezvous_store(env: ClusterEnvironment, timeout: Optional[timedelta]) -> torch.distributed.Store:
    """The store the mccl strategies (Trainer's and Fabric's) make their group with, `lightning_mccl.rendezvous`:
    it names the ranks (and hosts) that have not arrived while the others wait, fails naming them after the group
    timeout, and honours Ctrl-C meanwhile."""
    from ..rendezvous import rendezvous

    return rendezvous(env.main_address, env.main_port, env.global_rank(), env.world_size(),
                      timeout or default_pg_timeout)


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
            bucket_cap_mb defaults to MCCL_BUCKET_CAP_MB (5) over mccl, POWERSGD_BUCKET_CAP_MB (1000: one
            bucket) with compress="powersgd" over mccl, DDP's own (25) over other backends.
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
        timeout: Optional[Union[timedelta, float]] = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        compress: Optional[Literal["bf16", "fp16", "bf16_hook", "fp16_hook", "powersgd", "int8"]] = None,
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
        if bucket_cap_mb is None and process_group_backend == BACKEND:
            bucket_cap_mb = POWERSGD_BUCKET_CAP_MB if compress == "powersgd" else MCCL_BUCKET_CAP_MB
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
        created = not torch.distributed.is_initialized()
        if not created:
            require_mccl_default_group("MCCLStrategy")
        # The wire type travels in the new group's pg_options (read when the group is made), never in the
        # environment; a group Lightning reuses must already have it.
        existing = None if created else _backend.wire_dtype_of()
        settings = {**self.options.settings, **_compress.wire_settings(self._compress_plan.wire, existing)}
        kwargs = {}
        if created:
            kwargs = {"store": rendezvous_store(self.cluster_environment, self._timeout),
                      "pg_options": Options(settings) if settings else None}
        # No device_id: MCCL needs no device binding, and a bound default group binds every later group too.
        _init_dist_connection(self.cluster_environment, BACKEND, timeout=self._timeout, **kwargs)
        if created:
            _destroy_at_exit()

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
        for compress in _compress.WIRE:
            strategy_registry.register(
                f"mccl_{compress}_compress",
                cls,
                description=f"DDP over mccl, gradients all-reduced in {compress} on the wire",
                override=True,
                compress=compress,
            )


_destroy_registered = False


def destroy_at_exit() -> None:
    """The handler `_destroy_at_exit` registers: destroys the default group, Ctrl+C ignored meanwhile."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        torch.distributed.destroy_process_group()
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)


def _destroy_at_exit() -> None:
    """Once per process: destroy the default group at exit, before interpreter shutdown tears down the
    objects the engine's threads use."""
    global _destroy_registered
    if not _destroy_registered:
        atexit.register(destroy_at_exit)
        _destroy_registered = True


MCCLStrategy.register_strategies(StrategyRegistry)
mps_gate.install(MCCLStrategy)
from . import fabric as _fabric  # noqa: E402,F401 - registers Fabric's "mccl" names (it imports from here)
