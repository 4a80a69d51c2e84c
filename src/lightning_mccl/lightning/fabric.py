"""`MCCLFabricStrategy`: Lightning Fabric's DDP over `mccl`, registered in Fabric as "mccl" and "mccl_spawn".

    fabric = Fabric(strategy="mccl", accelerator="mps", num_nodes=24)   # or accelerator="cpu" / "auto"
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)

The Fabric counterpart of `MCCLStrategy` (strategy.py), with the same overrides of
`lightning.fabric.strategies.DDPStrategy` and for the same reasons:

- `_setup_distributed`: the group is made through the rendezvous that names missing ranks
  (`rendezvous_store`), with no `device_id` (a group bound to MPS binds the Gloo groups made after it too),
  and destroyed at interpreter exit (strategy.py's `_destroy_at_exit`);
- `_determine_ddp_device_ids`: None unless CUDA, so `setup_module` does not enter a CUDA stream on a Mac;
- DDP's buckets default to 5 MB over mccl (`MCCL_BUCKET_CAP_MB`, measured in strategy.py);
- `_set_world_ranks`: with $MCCL_HOSTFILE set and only the fallback `LightningEnvironment` chosen, the
  hostfile's fleet (`MacFleetEnvironment`).

These three DDPStrategy privates and `_init_dist_connection` (imported from strategy.py) are checked at
import (`internals`). Fabric's connector refuses a `ParallelStrategy` instance with an MPS accelerator
(`_Connector._check_config_and_set_final_flags`) exactly as the Trainer's does; the names above pass it (no
"ddp"/"dp" in them), and `mps_gate.install` lets `MCCLFabricStrategy` instances through that one
check, as it does `MCCLStrategy` in the Trainer's. No CommMetrics here: Fabric has no callbacks
it calls on its own; `lightning_mccl.stats()` gives the same counters to a Fabric loop.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional, Union

from typing_extensions import override

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import STRATEGY_REGISTRY, DDPStrategy, Strategy

import torch

from .. import _backend
from . import mps_gate
from .internals import checked_override
from .strategy import (MCCL_BUCKET_CAP_MB, _destroy_at_exit, _init_dist_connection, fleet_environment, group_timeout,
                       rendezvous_store, require_mccl_default_group)

FABRIC_DDP = "lightning.fabric.strategies.ddp"  # where the DDPStrategy privates overridden here live

BACKEND = _backend.BACKEND_NAME


class MCCLFabricStrategy(DDPStrategy):
    """Fabric's DDP over mccl; arguments as Fabric's DDPStrategy (the rest go to DistributedDataParallel)."""

    def __init__(self, *args: Any, process_group_backend: Optional[str] = BACKEND,
                 timeout: Optional[Union[timedelta, float]] = default_pg_timeout, **kwargs: Any) -> None:
        timeout = group_timeout(timeout, "MCCLFabricStrategy")
        if process_group_backend == BACKEND and kwargs.get("bucket_cap_mb") is None:
            kwargs["bucket_cap_mb"] = MCCL_BUCKET_CAP_MB  # the strategy's fleet default (strategy.py says why)
        super().__init__(*args, process_group_backend=process_group_backend, timeout=timeout, **kwargs)

    @override
    @checked_override(FABRIC_DDP, "DDPStrategy._set_world_ranks")
    def _set_world_ranks(self) -> None:
        self.cluster_environment = fleet_environment(self.cluster_environment)  # $MCCL_HOSTFILE's fleet
        super()._set_world_ranks()

    @override
    @checked_override(FABRIC_DDP, "DDPStrategy._setup_distributed")
    def _setup_distributed(self) -> None:
        if self._get_process_group_backend() != BACKEND:
            super()._setup_distributed()
            return
        self._set_world_ranks()
        self._process_group_backend = BACKEND
        assert self.cluster_environment is not None
        created = not torch.distributed.is_initialized()
        if not created:
            require_mccl_default_group("MCCLFabricStrategy")
        kwargs = {"store": rendezvous_store(self.cluster_environment, self._timeout)} if created else {}
        _init_dist_connection(self.cluster_environment, BACKEND, timeout=self._timeout, **kwargs)
        if created:
            _destroy_at_exit()

    @override
    @checked_override(FABRIC_DDP, "DDPStrategy._determine_ddp_device_ids")
    def _determine_ddp_device_ids(self) -> Optional[list[int]]:
        return [self.root_device.index] if self.root_device.type == "cuda" else None

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        for name, start_method in (("mccl", "popen"), ("mccl_spawn", "spawn")):
            strategy_registry.register(name, cls, description=f"Fabric DDP over mccl with `start_method={start_method!r}`",
                                       override=True, start_method=start_method)
        strategy_registry.register("mccl_find_unused_parameters_true", cls, override=True,
                                   description="Fabric DDP over mccl with `find_unused_parameters=True`",
                                   find_unused_parameters=True, start_method="popen")


MCCLFabricStrategy.register_strategies(STRATEGY_REGISTRY)
mps_gate.install(MCCLFabricStrategy, mps_gate.FABRIC, Strategy)
