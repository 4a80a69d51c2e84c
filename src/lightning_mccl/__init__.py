"""lightning-mccl: the `mccl` torch.distributed backend (TCP collectives for a fleet of Macs).

Importing this package registers the backend, so ``dist.init_process_group("mccl")`` works.
"""
from ._backend import ProcessGroupMCCL, is_registered, register
from .options import Options

register()

try:  # Lightning's "mccl" strategy names, once lightning.pytorch is imported; torch-only users pay nothing
    from .lightning import register_when_lightning_imported as _register_lightning

    _register_lightning()
except Exception as _e:  # noqa: BLE001 - a broken Lightning must never break the torch backend
    import warnings

    warnings.warn(f"lightning-mccl: Lightning integration unavailable: {_e!r}", RuntimeWarning)

from .stats import stats
from .timeline import clock_ns, timeline

__all__ = ["Options", "ProcessGroupMCCL", "clock_ns", "is_registered", "register", "stats", "timeline"]
__version__ = "0.1.0"
