"""Lightning integration: `MCCLStrategy` (registered as "mccl", "mccl_spawn", "mccl_bf16_compress", ...) and
`MacFleetEnvironment`.

    import lightning as L
    import lightning_mccl                      # registers the strategy names (either import order works)
    trainer = L.Trainer(strategy="mccl", num_nodes=24)

This module does not import Lightning itself, so that `import lightning_mccl` stays cheap for torch-only
users: the classes are loaded on first access, and `register_when_lightning_imported()` (called by
`import lightning_mccl`) registers the strategy names once `lightning.pytorch` has been imported.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["CommMetrics", "MCCLFabricStrategy", "MCCLStrategy", "MacFleetEnvironment",
           "register_when_lightning_imported"]

_LAZY = {"MCCLStrategy": "strategy", "MacFleetEnvironment": "environment", "CommMetrics": "comm_metrics",
         "MCCLFabricStrategy": "fabric"}
_TRIGGER = "lightning.pytorch"


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


def _register() -> None:
    """Imports the strategy modules (Trainer's and Fabric's), which register the strategies; a failure is a
    warning, never an error in the import of Lightning or of lightning_mccl."""
    try:
        importlib.import_module(f"{__name__}.strategy")
        importlib.import_module(f"{__name__}.fabric")
    except Exception as e:  # noqa: BLE001 - Lightning's import must go on; say why the names are missing
        warnings.warn(f"lightning-mccl: the 'mccl' Lightning strategies were not registered: {e!r}", RuntimeWarning)


def _loaded(name: str) -> bool:
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


class _RegisterAfterLoad(importlib.abc.Loader):
    """Runs `lightning.pytorch`'s own loader, then registers the strategies."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        spec = module.__spec__
        spec.loader = module.__loader__ = self._loader  # the module keeps its real loader
        self._loader.exec_module(module)
        _register()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _LightningImportHook(importlib.abc.MetaPathFinder):
    """One-shot finder: when `lightning.pytorch` is first imported, registers the strategies right after it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TRIGGER:
            return None
        _remove_hook()
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisterAfterLoad(spec.loader)
        return spec


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _LightningImportHook)]


def register_when_lightning_imported() -> None:
    """Registers the strategies now if `lightning.pytorch` is loaded, else as soon as it is imported; nothing
    when Lightning is not installed."""
    if _loaded(_TRIGGER):
        _register()
        return
    if _TRIGGER in sys.modules or any(isinstance(f, _LightningImportHook) for f in sys.meta_path):
        return  # being imported right now (its own import reached us), or already hooked
    try:
        installed = importlib.util.find_spec("lightning") is not None
    except (ImportError, ValueError):
        installed = False
    if installed:
        sys.meta_path.insert(0, _LightningImportHook())
