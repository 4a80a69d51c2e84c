"""DiLoCo for raw torch and for `MCCLDiLoCoStrategy`: the outer loop (outer.py), when each sync starts and
applies (schedule.py: the warm start, the H schedule, fragments), how a sync's pseudo-gradients are averaged
(averaging.py), and the settings' defaults and checks (settings.py, torch-free). No Lightning here.

    from lightning_mccl.diloco import DiLoCo, AllreduceMean, outer_group

The names below load torch on first use; `lightning_mccl.diloco.settings` alone does not.
"""
from __future__ import annotations

from .. import lazy
from .settings import (FRAGMENTS, MAX_SYNC_EVERY, OUTER_LR, OUTER_MOMENTUM, QSR_ALPHA, SYNC_DELAY, SYNC_EVERY,
                       WARM_START, check_schedule, check_settings)

_LAZY = {"DiLoCo": "outer", "LOCAL_KEYS": "outer", "OuterOptimizer": "outer", "default_outer_optimizer": "outer",
         "Averaging": "averaging", "InFlight": "averaging", "AllreduceMean": "averaging", "CastMean": "averaging",
         "Int8Mean": "averaging", "averaging_for": "averaging", "outer_group": "averaging", "Schedule": "schedule"}

__all__ = ["FRAGMENTS", "MAX_SYNC_EVERY", "OUTER_LR", "OUTER_MOMENTUM", "QSR_ALPHA", "SYNC_DELAY", "SYNC_EVERY",
           "WARM_START", "check_schedule", "check_settings", *_LAZY]
__getattr__, __dir__ = lazy.names(__name__, _LAZY, globals())
