"""Names of a package that load their module on first use (PEP 562's module `__getattr__`), so that importing
the package loads neither torch nor Lightning:

    __getattr__, __dir__ = lazy.names(__name__, {"DiLoCo": "outer", ...}, globals())
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Mapping, Tuple


def names(package: str, table: Mapping[str, str], namespace: Dict[str, Any]) -> Tuple[Callable, Callable]:
    """The package's `__getattr__` and `__dir__`: `table` maps a name to the submodule that defines it."""
    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> List[str]:
        return sorted(list(namespace) + list(table))

    return __getattr__, __dir__
