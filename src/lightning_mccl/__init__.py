"""lightning-mccl: the `mccl` torch.distributed backend (TCP collectives for a fleet of Macs).

Importing this package registers the backend, so ``dist.init_process_group("mccl")`` works.
"""
from ._backend import ProcessGroupMCCL, is_registered, register

register()

__all__ = ["ProcessGroupMCCL", "is_registered", "register"]
__version__ = "0.1.0"
