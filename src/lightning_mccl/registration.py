"""Everything that importing lightning_mccl changes outside the package, in one file.

`import lightning_mccl` calls `install()`, and nothing else of the package changes the world at import:

- the `mccl` backend is registered with torch.distributed (`register_backend`): at once when torch is loaded,
  else right after torch's first import. torch also finds it without any import, through the
  `torch.distributed.backends` entry point, which names `register_backend`;
- Lightning's strategy names (lightning/names.py's table) are registered in the Trainer's and Fabric's
  registries once `lightning.pytorch` is imported, as factories that import the strategy on first use, so that
  the registration never imports a strategy module (and torch-only users never load Lightning);
- on a machine where Lightning's MPS accelerator is available, its connectors' MPS check is wrapped so that
  instances of our strategies pass it (lightning/mps_gate.py says why); elsewhere Lightning stays as it is.

Waiting for a module's first import: a one-shot finder at the front of `sys.meta_path` wraps that module's own
loader, runs it, then calls the functions (`call_after_import`), and removes itself.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any, Callable, List

TORCH = "torch"
LIGHTNING = "lightning.pytorch"


def install() -> None:
    """What `import lightning_mccl` does (the module docstring)."""
    if loaded(TORCH):
        register_backend()  # an error (a missing or mismatched extension) raises here
    else:
        call_after_import(TORCH, _register_backend_quietly)
    if _lightning_installed():
        call_after_import(LIGHTNING, _register_lightning_quietly)


# -- the torch backend ---------------------------------------------------------------------------------------

def is_registered() -> bool:
    import torch.distributed as dist

    from .backend import BACKEND_NAME

    return BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {})


def register_backend() -> None:
    """Registers `mccl` for cpu, cuda and mps tensors. Idempotent; also the entry point torch calls."""
    import torch.distributed as dist

    from .backend import BACKEND_NAME, DEVICES, create_backend

    if not is_registered():
        dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=DEVICES)


def _register_backend_quietly() -> None:
    # Within `import torch`, an error would break torch's import: a warning says why "mccl" is missing, and
    # lightning_mccl.register() raises the error itself.
    try:
        register_backend()
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"lightning-mccl: the 'mccl' backend was not registered: {e!r}", RuntimeWarning)


# -- Lightning -------------------------------------------------------------------------------------------------

def register_lightning() -> None:
    """Registers the strategy names in the Trainer's and Fabric's registries, and the MPS gate where MPS is
    available. Idempotent (the registries are overwritten with the same entries; the gate wraps once)."""
    from lightning.fabric.strategies import STRATEGY_REGISTRY
    from lightning.pytorch.strategies import StrategyRegistry

    from .lightning import mps_gate, names

    for registry, front_end in ((StrategyRegistry, names.TRAINER), (STRATEGY_REGISTRY, names.FABRIC)):
        for name, (cls, arguments) in names.entries(front_end).items():
            described = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
            registry.register(name, functools.partial(_make, *cls), override=True,
                              description=f"{cls[1]} with {described}" if described else cls[1], **arguments)
    if mps_gate.mps_available():
        for connector in (mps_gate.TRAINER, mps_gate.FABRIC):
            owner, method = mps_gate.connector_method(connector)
            if not getattr(getattr(owner, method), mps_gate.MARK, False):
                setattr(owner, method, mps_gate.gated(getattr(owner, method), connector))


def _make(module: str, cls: str, **arguments: Any) -> Any:
    """A registered name's strategy: its class imported on first use, made with the name's arguments."""
    return getattr(importlib.import_module(module), cls)(**arguments)


def _register_lightning_quietly() -> None:
    try:  # a broken Lightning must never break the torch backend or Lightning's own import
        register_lightning()
    except Exception as e:  # noqa: BLE001 - say why the names are missing
        warnings.warn(f"lightning-mccl: the 'mccl' Lightning strategies were not registered: {e!r}", RuntimeWarning)


def _lightning_installed() -> bool:
    if loaded(LIGHTNING):
        return True
    try:
        return importlib.util.find_spec("lightning") is not None
    except (ImportError, ValueError):
        return False


# -- after a module's import -----------------------------------------------------------------------------------

def loaded(name: str) -> bool:
    """`name` is imported, and its import has finished (not one still running that reached the caller)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


class _RunAfterLoad(importlib.abc.Loader):
    """Runs the module's own loader, then the functions."""

    def __init__(self, loader, then: List[Callable[[], None]]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        spec = module.__spec__
        spec.loader = module.__loader__ = self._loader  # the module keeps its real loader
        self._loader.exec_module(module)
        for then in self._then:
            then()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Hook(importlib.abc.MetaPathFinder):
    """One-shot finder: on the first import of `name`, wraps its loader so that the functions run after it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.then: List[Callable[[], None]] = []

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RunAfterLoad(spec.loader, self.then)
        return spec


def call_after_import(name: str, then: Callable[[], None]) -> None:
    """Calls `then` now if `name` is loaded, else right after `name` is first imported. Nothing when `name` is
    being imported right now: its own import reached the caller (torch's entry point registers the backend on
    first use anyway)."""
    if loaded(name):
        then()
        return
    if name in sys.modules:
        return
    hook = next((f for f in sys.meta_path if isinstance(f, _Hook) and f.name == name), None)
    if hook is None:
        hook = _Hook(name)
        sys.meta_path.insert(0, hook)
    hook.then.append(then)
