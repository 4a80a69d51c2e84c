"""`ElasticEnvironment`: where a process of an elastic job starts, from the variables `mccl launch --elastic`
(or `mccl join`) sets.

It is torchrun's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, NODE_RANK), with two
differences that an elastic job needs:

- it does not compare WORLD_SIZE with the Trainer's ``num_nodes x devices``: the job's size changes while it
  runs, and a rank that `mccl join` starts is told the size of its own launch, not the job's;
- it says whether this process joins a running job (MCCL_ELASTIC_JOIN=1, set by `mccl join` and by `mccl launch
  --elastic` when it starts a host again).

Rank and size during training are the current membership's (`MCCLElasticStrategy.global_rank`, `world_size`);
these are the launch's.
"""
from __future__ import annotations

import os

from typing_extensions import override

from lightning.fabric.plugins.environments import TorchElasticEnvironment

from ..launcher.launch_plan import launched_as_joiner


class ElasticEnvironment(TorchElasticEnvironment):
    """The launch's variables, without the check of the world size (module docstring)."""

    @staticmethod
    @override
    def detect() -> bool:
        return all(name in os.environ for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Nothing to check: the job's size is its membership's, not the Trainer's num_nodes x devices."""

    @property
    def joining(self) -> bool:
        """Whether this process joins a running job (it was not one of the launched members)."""
        return launched_as_joiner()


__all__ = ["ElasticEnvironment"]
