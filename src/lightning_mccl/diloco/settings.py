"""DiLoCo's settings: their defaults, declared once (the strategy, the raw-torch `DiLoCo` and `mccl plan` read
them here), and their checks. No torch here, so that `mccl plan` reads them without loading it."""
from __future__ import annotations

from typing import Any

# The outer step's defaults: plain averaging of the ranks' progress every round (local SGD). The DiLoCo paper's
# Nesterov 0.7 / 0.9 (for H = 500) lost far more at H = 2-32 (docs/diloco.md, "Choosing H, tau and the learning
# rates for 2-24 Macs").
OUTER_LR = 1.0
OUTER_MOMENTUM = 0.0
# Inner steps per round when not given (MCCLDiLoCoStrategy, `mccl plan`): docs/diloco.md, "Choosing H, tau and
# the learning rates for 2-24 Macs", says why 4.
SYNC_EVERY = 4


def check_settings(sync_every: Any, outer_lr: Any, outer_momentum: Any, sync_delay: Any, owner: str) -> None:
    """ValueError naming the setting for anything DiLoCo cannot run with."""
    if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
        raise ValueError(f"{owner}(sync_every={sync_every!r}): expected the inner steps per round, an int >= 1")
    if isinstance(sync_delay, bool) or not isinstance(sync_delay, int) or not 1 <= sync_delay <= sync_every:
        raise ValueError(f"{owner}(sync_delay={sync_delay!r}): expected an int from 1 to sync_every={sync_every} "
                         f"(inner steps between a round's end and its outer step)")
    if isinstance(outer_lr, bool) or not isinstance(outer_lr, (int, float)) or not outer_lr > 0:
        raise ValueError(f"{owner}(outer_lr={outer_lr!r}): expected a number > 0")
    if isinstance(outer_momentum, bool) or not isinstance(outer_momentum, (int, float)) \
            or not 0 <= outer_momentum < 1:
        raise ValueError(f"{owner}(outer_momentum={outer_momentum!r}): expected a number in [0, 1)")
