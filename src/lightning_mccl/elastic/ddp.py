"""torch's DistributedDataParallel over the elastic group.

DDP holds `manager.pg` (the group object stays while what it wraps is re-formed), with:

- a comm hook that reduces each gradient bucket through `ElasticManager.allreduce`: weighted by each member's
  part of the global batch, divided by the quorum's size, and never raising (a failure fails the step's vote);
- ``init_sync=False``: the members agree on the weights by the state the manager sends (at the first step
  boundary every member but host 0's receives it; later, each joiner), not by DDP's broadcast, which a joiner
  would call alone;
- ``find_unused_parameters=True``, which keeps DDP from rebuilding its buckets after the first step: a joiner's
  DDP is new, and buckets laid out in another order than the other members' would add up different
  parameters. It costs a pass over the autograd graph per step.
"""
from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .manager import ElasticManager


def _reduce_bucket(manager: ElasticManager, bucket):
    return manager.allreduce(bucket.buffer())


def elastic_ddp(module: nn.Module, manager: ElasticManager, **kwargs) -> DistributedDataParallel:
    """`module` in DDP over the elastic group (see the module docstring); `kwargs` go to DDP."""
    for name in ("process_group", "init_sync", "find_unused_parameters"):
        if name in kwargs:
            raise ValueError(f"elastic_ddp sets DDP's {name} itself (see lightning_mccl.elastic.ddp)")
    model = DistributedDataParallel(module, process_group=manager.pg, init_sync=False, find_unused_parameters=True,
                                    **kwargs)
    model.register_comm_hook(manager, _reduce_bucket)
    return model


__all__ = ["elastic_ddp"]
