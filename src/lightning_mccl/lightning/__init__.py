"""Lightning integration: `MCCLStrategy` (registered as "mccl", "mccl_spawn", "mccl_bf16_compress", ...) and
`MacFleetEnvironment`.

    import lightning as L
    import lightning_mccl                      # registers the strategy names (either import order works)
    trainer = L.Trainer(strategy="mccl", num_nodes=24)

This module does not import Lightning itself, so that `import lightning_mccl` stays cheap for torch-only
users: the classes are loaded on first access, and `register_when_lightning_imported()` (called by
`import lightning_mccl`) registers the strategy names once `lightning.pytorch` has been imported. The Trainer's
names are strategy.py's to register and Fabric's fabric.py's (one table: names.py), each as its module ends, as
Lightning's own strategies do; `_register` imports both.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

from .._after_import import call_after_import, loaded

__all__ = ["CommMetrics", "MCCLFabricStrategy", "MCCLStrategy", "MacFleetEnvironment",
           "register_when_lightning_imported"]

_LAZY = {"MCCLStrategy": "strategy", "MacFleetEnvironment": "environment", "CommMetrics": "comm_metrics",
         "MCCLFabricStrategy": "fabric"}
_TRIGGER = "lightning.pytorch"


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        if loaded(_TRIGGER):
            _register()  # when that module was the one to import Lightning, registering waited for it
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


_FRONT_ENDS = ("strategy", "fabric")  # each registers its class in its own registry (Trainer's, Fabric's)


def _register() -> None:
    """Imports the Trainer's and Fabric's strategy modules, which register their names as they end; a failure is
    a warning, never an error in the import of Lightning or of lightning_mccl. Nothing while a module of this
    package is being imported (it imported Lightning: `__getattr__` registers once it has loaded)."""
    prefix = f"{__name__}."
    if any(name.startswith(prefix) and module is not None and not loaded(name)
           for name, module in list(sys.modules.items())):
        return
    try:
        for front_end in _FRONT_ENDS:
            if sys.modules.get(f"{__name__}.{front_end}") is None:
                importlib.import_module(f"{__name__}.{front_end}")
    except Exception as e:  # noqa: BLE001 - Lightning's import must go on; say why the names are missing
        warnings.warn(f"lightning-mccl: the 'mccl' Lightning strategies were not registered: {e!r}", RuntimeWarning)


def register_when_lightning_imported() -> None:
    """Registers the strategies now if `lightning.pytorch` is loaded, else as soon as it is imported; nothing
    when Lightning is not installed."""
    if not loaded(_TRIGGER):
        try:
            if importlib.util.find_spec("lightning") is None:
                return
        except (ImportError, ValueError):
            return
    call_after_import(_TRIGGER, _register)
