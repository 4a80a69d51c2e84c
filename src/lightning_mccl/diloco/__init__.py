"""DiLoCo for raw torch and for `MCCLDiLoCoStrategy`: the outer loop (outer.py), how a round's pseudo-gradients
are averaged (averaging.py), and the settings' defaults and checks (settings.py, torch-free). No Lightning here.

    from lightning_mccl.diloco import DiLoCo, AllreduceMean, outer_group

The names below load torch on first use; `lightning_mccl.diloco.settings` alone does not.
"""
from __future__ import annotations

from .. import lazy

from .settings import OUTER_LR, OUTER_MOMENTUM, SYNC_EVERY, check_settings

_LAZY = {"DiLoCo": "outer", "LOCAL_KEYS": "outer", "OuterOptimizer": "outer", "default_outer_optimizer": "outer",
         "Averaging": "averaging", "InFlight": "averaging", "AllreduceMean": "averaging", "CastMean": "averaging",
         "Int8Mean": "averaging", "averaging_for": "averaging", "outer_group": "averaging"}

__all__ = ["OUTER_LR", "OUTER_MOMENTUM", "SYNC_EVERY", "check_settings", *_LAZY]
__getattr__, __dir__ = lazy.names(__name__, _LAZY, globals())
