"""`MCCLFabricStrategy`: Lightning Fabric's DDP over `mccl`, registered in Fabric as "mccl", "mccl_spawn", ...
(names.py).

    fabric = Fabric(strategy="mccl", accelerator="mps", num_nodes=24)   # or accelerator="cpu" / "auto"
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)

The Fabric counterpart of `MCCLStrategy` (strategy.py), with the same overrides of
`lightning.fabric.strategies.DDPStrategy` and for the same reasons:

- `_setup_distributed`: the default group through `group.init_default_group`, as the Trainer's strategy makes
  it (no `device_id`, the rendezvous that names missing ranks, only an mccl group reused, destroyed at exit);
- `_determine_ddp_device_ids`: None unless CUDA, so `setup_module` does not enter a CUDA stream on a Mac;
- DDP's buckets default to 5 MB over mccl (`group.bucket_cap_mb`);
- `_set_world_ranks`: with $MCCL_HOSTFILE set and only the fallback `LightningEnvironment` chosen, the
  hostfile's fleet (`MacFleetEnvironment`).

These three DDPStrategy privates and `_init_dist_connection` (group.py) are checked at import (`internals`).
Fabric's connector refuses a `ParallelStrategy` instance with an MPS accelerator
(`_Connector._check_config_and_set_final_flags`) exactly as the Trainer's does; the names pass it (no
"ddp"/"dp" in them), and `mps_gate.install` lets `MCCLFabricStrategy` instances through that one check, as it
does `MCCLStrategy` in the Trainer's. No CommMetrics here: Fabric has no callbacks
it calls on its own; `lightning_mccl.stats()` gives the same counters to a Fabric loop.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Optional, Union

from typing_extensions import override

from lightning.fabric.strategies import STRATEGY_REGISTRY, DDPStrategy, Strategy

from . import mps_gate, names
from .group import (BACKEND, DEFAULT_TIMEOUT, bucket_cap_mb, check_devices_per_node, fleet_environment, group_timeout,
                    init_default_group)
from .internals import checked_override

FABRIC_DDP = "lightning.fabric.strategies.ddp"  # where the DDPStrategy privates overridden here live


class MCCLFabricStrategy(DDPStrategy):
    """Fabric's DDP over mccl; arguments as Fabric's DDPStrategy (the rest go to DistributedDataParallel)."""

    def __init__(self, *args: Any, process_group_backend: Optional[str] = BACKEND,
                 timeout: Optional[Union[timedelta, float]] = DEFAULT_TIMEOUT, **kwargs: Any) -> None:
        timeout = group_timeout(timeout, "MCCLFabricStrategy")
        cap = bucket_cap_mb(kwargs.pop("bucket_cap_mb", None), process_group_backend)
        if cap is not None:
            kwargs["bucket_cap_mb"] = cap
        super().__init__(*args, process_group_backend=process_group_backend, timeout=timeout, **kwargs)

    @override
    @checked_override(FABRIC_DDP, "DDPStrategy._set_world_ranks")
    def _set_world_ranks(self) -> None:
        self.cluster_environment = fleet_environment(self.cluster_environment)  # $MCCL_HOSTFILE's fleet
        check_devices_per_node(self.num_processes, self.num_nodes)
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
        init_default_group("MCCLFabricStrategy", self.cluster_environment, self._timeout)

    @override
    @checked_override(FABRIC_DDP, "DDPStrategy._determine_ddp_device_ids")
    def _determine_ddp_device_ids(self) -> Optional[list[int]]:
        return [self.root_device.index] if self.root_device.type == "cuda" else None

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        names.register(strategy_registry, cls, names.FABRIC)


MCCLFabricStrategy.register_strategies(STRATEGY_REGISTRY)
mps_gate.install(MCCLFabricStrategy, mps_gate.FABRIC, Strategy)
