"""lightning-mccl: the `mccl` torch.distributed backend (TCP collectives for a fleet of Macs).

Importing this package registers the backend, so ``dist.init_process_group("mccl")`` works: at once when
torch is loaded, else as soon as it is. The package itself loads neither torch nor Lightning, so that the
`mccl` command line starts in a fraction of a second; the names below load what they need on first use.
"""
from __future__ import annotations

import importlib
import sys
import warnings

from ._after_import import call_after_import, loaded
from .options import Options

# name -> the module that holds it; loading any of them loads torch and the extension
_LAZY = {"ProcessGroupMCCL": "_backend", "is_registered": "_backend", "register": "_backend", "stats": "_stats",
         "timeline": "_timeline", "clock_ns": "_timeline"}


def __getattr__(name: str):
    if name == "_C" or name in _LAZY:  # `from lightning_mccl import _C` too: the extension needs torch's libraries
        import torch  # noqa: F401

        module = importlib.import_module(f"{__name__}.{_LAZY.get(name, name)}")
        return module if name == "_C" else getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


def _register_backend_after_torch() -> None:
    # Importing _backend registers the backend. A module of ours that imported torch is still running (then
    # it holds _backend, or imports it): nothing to do. Within `import torch`, an error would break torch's
    # import: a warning says why "mccl" is missing, and lightning_mccl.register() raises the error itself.
    if sys.modules.get(f"{__name__}._backend") is not None:
        return
    try:
        importlib.import_module(f"{__name__}._backend")
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"lightning-mccl: the 'mccl' backend was not registered: {e!r}", RuntimeWarning)


if loaded("torch"):
    importlib.import_module(f"{__name__}._backend")  # an error (a missing or mismatched extension) raises here
else:
    call_after_import("torch", _register_backend_after_torch)

try:  # Lightning's "mccl" strategy names, once lightning.pytorch is imported; torch-only users pay nothing
    from .lightning import register_when_lightning_imported as _register_lightning

    _register_lightning()
except Exception as _e:  # noqa: BLE001 - a broken Lightning must never break the torch backend
    warnings.warn(f"lightning-mccl: Lightning integration unavailable: {_e!r}", RuntimeWarning)

__all__ = ["Options", "ProcessGroupMCCL", "clock_ns", "is_registered", "register", "stats", "timeline"]
__version__ = "0.1.0"
