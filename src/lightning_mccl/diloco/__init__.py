"""DiLoCo for raw torch and for `MCCLDiLoCoStrategy`: the outer loop (outer.py), how a round's pseudo-gradients
are averaged (averaging.py), and the settings' defaults and checks (settings.py, torch-free). No Lightning here.

    from lightning_mccl.diloco import DiLoCo, AllreduceMean, outer_group

The names below load torch on first use; `lightning_mccl.diloco.settings` alone does not.
"""
from __future__ import annotations

import importlib

from .settings import OUTER_LR, OUTER_MOMENTUM, SYNC_EVERY, check_settings

_LAZY = {"DiLoCo": "outer", "LOCAL_KEYS": "outer", "OuterOptimizer": "outer", "default_outer_optimizer": "outer",
         "Averaging": "averaging", "InFlight": "averaging", "AllreduceMean": "averaging", "CastMean": "averaging",
         "Int8Mean": "averaging", "averaging_for": "averaging", "outer_group": "averaging"}

__all__ = ["OUTER_LR", "OUTER_MOMENTUM", "SYNC_EVERY", "check_settings", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
