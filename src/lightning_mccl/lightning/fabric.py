"""`MCCLFabricStrategy`: Lightning Fabric's DDP over `mccl`, registered in Fabric as "mccl", "mccl_spawn", ...
(names.py).

    fabric = Fabric(strategy="mccl", accelerator="mps", num_nodes=24)   # or accelerator="cpu" / "auto"
    fabric.launch()
    model, optimizer = fabric.setup(model, optimizer)

The Fabric counterpart of `MCCLStrategy` (strategy.py, base.py), with the same overrides of
`lightning.fabric.strategies.DDPStrategy` and for the same reasons:

- `_setup_distributed`: `compress` resolved by the wire policy once the device is known, then the default group
  through `group.init_default_group`, as the Trainer's strategies make it (no `device_id`, the rendezvous that
  names missing ranks, the options and wire type in its pg_options, only an mccl group reused, destroyed at exit);
- `setup_module`: DDP's buckets are the resolution's size unless `bucket_cap_mb` is given, and the comm hook
  that `compress` needs is registered (hooks.py);
- `_determine_ddp_device_ids`: None unless CUDA, so `setup_module` does not enter a CUDA stream on a Mac;
- `_set_world_ranks`: with $MCCL_HOSTFILE set and only the fallback `LightningEnvironment` chosen, the
  hostfile's fleet (`MacFleetEnvironment`).

These three DDPStrategy privates are checked at import, `_init_dist_connection` and the connector's check when
the strategy is made (`internals`). Fabric's connector refuses a `ParallelStrategy` instance with an MPS
accelerator exactly as the Trainer's does; the names pass it (no "ddp"/"dp" in them), and `runs_on_mps` lets
instances through (mps_gate.py). No CommMetrics here: Fabric has no callbacks it calls on its own;
`lightning_mccl.stats()` gives the same counters to a Fabric loop.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Mapping, Optional, Union

from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning.fabric.strategies import DDPStrategy

from .. import wire_policy
from ..options import Options
from ..wire_policy import Compress, Resolution
from . import hooks, internals
from .base import checked_options
from .group import BACKEND, DEFAULT_TIMEOUT, check_devices_per_node, fleet_environment, group_timeout, \
    init_default_group
from .internals import checked_override

FABRIC_DDP = "lightning.fabric.strategies.ddp"  # where the DDPStrategy privates overridden here live
OWNER = "MCCLFabricStrategy"


class MCCLFabricStrategy(DDPStrategy):
    """Fabric's DDP over mccl; arguments as Fabric's DDPStrategy (the rest go to DistributedDataParallel), plus
    `compress`, `compress_options` and `options` as `MCCLStrategy` takes them."""

    runs_on_mps = True

    def __init__(self, *args: Any, process_group_backend: Optional[str] = BACKEND,
                 timeout: Optional[Union[timedelta, float]] = DEFAULT_TIMEOUT, compress: Optional[Compress] = None,
                 compress_options: Optional[dict] = None, options: Optional[Union[Options, Mapping[str, object]]] = None,
                 **kwargs: Any) -> None:
        internals.check_lightning()
        self.compress_options = hooks.check(OWNER, compress, compress_options, process_group_backend, None, None,
                                            None)
        self.options = checked_options(OWNER, options)
        super().__init__(*args, process_group_backend=process_group_backend, timeout=group_timeout(timeout, OWNER),
                         **kwargs)
        self.compress = compress
        self.wire: Optional[Resolution] = None  # compress resolved, at setup

    @override
    @checked_override(FABRIC_DDP, "DDPStrategy._set_world_ranks")
    def _set_world_ranks(self) -> None:
        self.cluster_environment = fleet_environment(self.cluster_environment)  # $MCCL_HOSTFILE's fleet
        check_devices_per_node(self.num_processes, self.num_nodes)
        super()._set_world_ranks()

    @override
    @checked_override(FABRIC_DDP, "DDPStrategy._setup_distributed")
    def _setup_distributed(self) -> None:
        self.wire = wire_policy.resolve(self.compress, self.root_device.type, self._get_process_group_backend(),
                                        OWNER)
        if self._get_process_group_backend() != BACKEND:
            super()._setup_distributed()
            return
        self._set_world_ranks()
        self._process_group_backend = BACKEND
        assert self.cluster_environment is not None
        init_default_group(OWNER, self.cluster_environment, self._timeout, self.options.settings, self.wire.wire)

    @override
    def setup_module(self, module: Module) -> DistributedDataParallel:
        if self.wire.bucket_mb is not None:
            self._ddp_kwargs.setdefault("bucket_cap_mb", self.wire.bucket_mb)
        ddp = super().setup_module(module)
        hook = hooks.build(OWNER, self.wire, self.compress_options, None, None, None)
        if hook.check is not None:
            hook.check(module)
        if hook.hook is not None:
            ddp.register_comm_hook(state=hook.state, hook=hook.hook)
        return ddp

    @override
    @checked_override(FABRIC_DDP, "DDPStrategy._determine_ddp_device_ids")
    def _determine_ddp_device_ids(self) -> Optional[list[int]]:
        return [self.root_device.index] if self.root_device.type == "cuda" else None
