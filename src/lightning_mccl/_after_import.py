"""Run a function once a module is imported: at once if it is loaded, else right after its first import ends.

`import lightning_mccl` uses it twice without importing either module itself: the backend registers when
torch is loaded (so `mccl`, the command line, starts without loading torch), and the Lightning strategy
names register when `lightning.pytorch` is. A one-shot finder at the front of `sys.meta_path` wraps the
module's own loader, runs it, then calls the function.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable, List


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
    """Calls `then` now if `name` is loaded, else right after `name` is first imported. Nothing when `name`
    is being imported right now: its own import reached the caller."""
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
