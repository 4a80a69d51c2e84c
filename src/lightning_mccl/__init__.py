"""lightning-mccl: the `mccl` torch.distributed backend (TCP collectives for a fleet of Macs).

Importing this package registers the backend, so ``dist.init_process_group("mccl")`` works: at once when
torch is loaded, else as soon as it is; and Lightning's "mccl" strategy names, once Lightning is imported
(registration.py, the one place where importing the package changes anything outside it). The package itself
loads neither torch nor Lightning, so that the `mccl` command line starts in a fraction of a second; the
names below load what they need on first use.
"""
from __future__ import annotations

import importlib

from . import registration
from .options import Options

# name -> the module that holds it; loading any of them loads torch and the extension
_LAZY = {"ProcessGroupMCCL": "backend", "is_registered": "registration", "register": "registration",
         "stats": "counters", "timeline": "_timeline", "clock_ns": "_timeline"}
_RENAMED = {"register": "register_backend"}


def __getattr__(name: str):
    if name == "_C" or name in _LAZY:  # `from lightning_mccl import _C` too: the extension needs torch's libraries
        import torch  # noqa: F401

        module = importlib.import_module(f"{__name__}.{_LAZY.get(name, name)}")
        return module if name == "_C" else getattr(module, _RENAMED.get(name, name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


registration.install()

__all__ = ["Options", "ProcessGroupMCCL", "clock_ns", "is_registered", "register", "stats", "timeline"]
__version__ = "0.1.0"
