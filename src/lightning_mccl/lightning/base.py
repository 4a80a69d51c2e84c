"""What the Trainer's two mccl strategies share (`MCCLStrategy`, DDP; `MCCLDiLoCoStrategy`, DiLoCo): Lightning's
`DDPStrategy` with `process_group_backend="mccl"`, overriding only what stops it on a fleet of Macs
(`lightning.pytorch.strategies.ddp`, Lightning 2.5-2.6):

- `setup_distributed`: `compress` resolved once, now that the device is known (wire_policy.resolve: the one
  decision of how values travel), then the default group through `group.init_default_group` (shared with
  Fabric's strategy: no `device_id`, the rendezvous that names missing ranks, the strategy's options and the
  wire type in its pg_options, only an mccl group reused, destroyed at exit; group.py says why).
- `determine_ddp_device_ids`: None unless the device is CUDA, so `_setup_model` does not enter
  `torch.cuda.stream(torch.cuda.Stream())`, which fails on a Mac without CUDA.
- `set_world_ranks`: with $MCCL_HOSTFILE set and only Lightning's fallback `LightningEnvironment` chosen,
  uses `MacFleetEnvironment` (the hostfile's fleet) instead.
- `setup`: the `CommMetrics` callback (comm_metrics.py) joins a fit, which names the strategy's `comm_mode()` and
  its measured accuracy cost at the end; first, every rank checks that all resumed from the same checkpoint.

`runs_on_mps` lets instances past the MPS check of Lightning's connector (mps_gate.py); the registered names
avoid "ddp", so they pass it as they are. The Lightning internals used are checked when a strategy is made
(internals.py).
"""
from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Mapping, Optional, Union

from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from .. import wire_policy
from ..accuracy_costs import Mode
from ..options import Options
from ..wire_policy import WIRE_ENV, Resolution
from . import comm_metrics, internals
from .group import BACKEND, check_devices_per_node, fleet_environment, group_timeout, init_default_group
from .resume import check_same_checkpoint

log = logging.getLogger(__name__)


def checked_options(owner: str, options: Optional[Union[Options, Mapping[str, object]]]) -> Options:
    """A strategy's `options` as Options (which checks the names); ValueError for MCCL_WIRE_DTYPE, which is
    `compress`'s to choose."""
    options = Options(options.settings if isinstance(options, Options) else options)
    if WIRE_ENV in options.settings:
        raise ValueError(f"{owner}(options=...): {WIRE_ENV} is chosen by compress= (\"bf16\", \"fp16\"), not by the "
                         f"options")
    return options


class MCCLBase(DDPStrategy):
    """The shared part (module docstring). A subclass stores `compress` and says whether it is DiLoCo's."""

    runs_on_mps = True
    diloco_compress = False  # True: `compress` is how DiLoCo's pseudo-gradients travel, not DDP's gradients

    def __init__(self, *, process_group_backend: Optional[str], timeout: Optional[Union[timedelta, float]],
                 compress: Optional[str], comm_metrics_option: Any,
                 options: Optional[Union[Options, Mapping[str, object]]], **kwargs: Any) -> None:
        internals.check_lightning()
        owner = type(self).__name__
        wire_policy.row(compress, owner, diloco=self.diloco_compress)
        self.options = checked_options(owner, options)
        self.comm_metrics = comm_metrics.comm_metrics_option(comm_metrics_option)
        super().__init__(process_group_backend=process_group_backend, timeout=group_timeout(timeout, owner),
                         **kwargs)
        self.compress = compress
        self.wire: Optional[Resolution] = None  # compress resolved, at setup

    def comm_mode(self) -> Mode:
        """How this strategy trains, for the end-of-fit summary's line on its accuracy cost (accuracy_costs.py)."""
        raise NotImplementedError

    def _uses_mccl(self) -> bool:
        return self._get_process_group_backend() == BACKEND

    def _group_wire(self) -> Optional[str]:
        """The wire type of the default group (DiLoCo keeps its own in the outer group)."""
        return None if self.diloco_compress else self.wire.wire

    @override
    def set_world_ranks(self) -> None:
        self.cluster_environment = fleet_environment(self.cluster_environment)  # $MCCL_HOSTFILE's fleet
        check_devices_per_node(self.num_processes, self.num_nodes)
        super().set_world_ranks()

    def resolve_wire(self) -> None:
        """`compress` resolved for the root device and the backend (self.wire): the one decision of how values
        travel, which everything after reads."""
        self.wire = wire_policy.resolve(self.compress, self.root_device.type, self._get_process_group_backend(),
                                        type(self).__name__, diloco=self.diloco_compress)

    @override
    def setup_distributed(self) -> None:
        owner = type(self).__name__
        self.resolve_wire()
        if not self._uses_mccl():
            super().setup_distributed()
            return
        log.debug(f"{owner}: setting up distributed...")
        reset_seed()
        self.set_world_ranks()
        self._process_group_backend = BACKEND
        assert self.cluster_environment is not None
        init_default_group(owner, self.cluster_environment, self._timeout, self.options.settings, self._group_wire())

    @override
    def setup(self, trainer: Any) -> None:
        check_same_checkpoint(type(self).__name__, trainer.ckpt_path)
        comm_metrics.attach(trainer, self.comm_metrics)
        super().setup(trainer)

    @override
    def determine_ddp_device_ids(self) -> Optional[list]:
        if self.root_device.type != "cuda":
            return None  # DDPStrategy returns [index] for MPS, which makes _setup_model create a CUDA stream
        return [self.root_device.index]
