"""Elastic training: members leave and join a running job, no sample is lost or repeated (docs/elastic.md).

- `ElasticSampler` (sampler.py): each step's global batch dealt to the current members; the ledger;
- membership.py: who is in at each step boundary, decided once in host 0's Store and read by all;
- pace.py: each member's share of the global batch from its measured samples/s;
- `ElasticProcessGroup` (process_group.py): the group DDP holds, re-formed in place;
- `ElasticManager` (manager.py): the loop's start_step / should_commit, the vote, the state sent to joiners;
- fingerprint.py: what a joiner must share with the job (versions, model, config), or it is refused;
- `elastic_ddp` (ddp.py): torch's DDP over the elastic group;
- `ElasticDiLoCo` (diloco.py): DiLoCo's outer step at each round's end, one round per elastic step.

``import lightning_mccl`` does not import this package (it loads torch).
"""
from __future__ import annotations

from .ddp import elastic_ddp
from .diloco import ElasticDiLoCo
from .errors import (HOST_ZERO_MUST_STAY, Diverged, ElasticError, HostZeroLost, JoinRefused, Reconfiguring,
                     Removed, TooFewMembers)
from .manager import ElasticManager, Step
from .process_group import ElasticProcessGroup
from .sampler import Deal, ElasticSampler
from .settings import ElasticSettings

__all__ = ["ElasticSampler", "Deal", "ElasticSettings", "ElasticManager", "Step", "ElasticProcessGroup", "elastic_ddp",
           "ElasticDiLoCo",
           "ElasticError", "HostZeroLost", "Removed", "TooFewMembers", "Diverged", "JoinRefused", "Reconfiguring",
           "HOST_ZERO_MUST_STAY"]
