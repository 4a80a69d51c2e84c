"""DiLoCo's settings: their defaults, declared once (the strategy, the raw-torch `DiLoCo` and `mccl plan` read
them here), and their checks. No torch here, so that `mccl plan` reads them without loading it."""
from __future__ import annotations

from typing import Any, Union

# The outer step's defaults: plain averaging of the ranks' progress every round (local SGD). The DiLoCo paper's
# Nesterov 0.7 / 0.9 (for H = 500) lost far more at H = 2-32 (docs/diloco.md, "Choosing H, tau and the learning
# rates for 2-24 Macs").
OUTER_LR = 1.0
OUTER_MOMENTUM = 0.0
# Inner steps per round when not given (MCCLDiLoCoStrategy, `mccl plan`): docs/diloco.md, "Choosing H, tau and
# the learning rates for 2-24 Macs", says why 3.
SYNC_EVERY = 3
# Inner steps between a round's end and its outer step (tau).
SYNC_DELAY = 1
# The options for short jobs (docs/diloco.md, "Options for short jobs"), off by default until a sweep says
# otherwise. warm_start: the first K inner steps each a round of one step whose outer step applies at once.
WARM_START = 0
# fragments: the trainable parameters in F parts, each synced on its own step of the round (Streaming DiLoCo).
# "auto": F = min(H, the trainable parameter tensors) (resolve_fragments), a fragment a step: as fast as the
# whole model synced at the round's end or faster, at the same accuracy (docs/diloco.md, "Fragments").
AUTO = "auto"
FRAGMENTS = AUTO
# qsr_alpha: the H schedule, H = max(sync_every, floor((alpha / lr)^2)) once the learning rate falls below its
# peak (QSR), at most max_sync_every (which it needs). None: H = sync_every throughout.
QSR_ALPHA = None
MAX_SYNC_EVERY = None


def _int_at_least(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def resolve_fragments(fragments: Union[int, str], sync_every: int, tensors: int) -> int:
    """The number of fragments `fragments` (an int, or "auto") stands for, with rounds of `sync_every` steps (the
    base H with the H schedule) and a model of `tensors` trainable parameter tensors: "auto" is
    min(sync_every, tensors) (1 for a model without any, which DiLoCo then refuses)."""
    return max(1, min(sync_every, tensors)) if fragments == AUTO else fragments


def check_settings(sync_every: Any, outer_lr: Any, outer_momentum: Any, sync_delay: Any, owner: str) -> None:
    """ValueError naming the setting for anything DiLoCo cannot run with."""
    if not _int_at_least(sync_every, 1):
        raise ValueError(f"{owner}(sync_every={sync_every!r}): expected the inner steps per round, an int >= 1")
    if not _int_at_least(sync_delay, 1) or sync_delay > sync_every:
        raise ValueError(f"{owner}(sync_delay={sync_delay!r}): expected an int from 1 to sync_every={sync_every} "
                         f"(inner steps between a round's end and its outer step)")
    if not _positive_number(outer_lr):
        raise ValueError(f"{owner}(outer_lr={outer_lr!r}): expected a number > 0")
    if isinstance(outer_momentum, bool) or not isinstance(outer_momentum, (int, float)) \
            or not 0 <= outer_momentum < 1:
        raise ValueError(f"{owner}(outer_momentum={outer_momentum!r}): expected a number in [0, 1)")


def check_fragments(fragments: Any, owner: str) -> None:
    """ValueError naming the setting unless `fragments` is an int >= 1 or "auto" (the number is checked against
    the model's parameters where they are known)."""
    if fragments != AUTO and not _int_at_least(fragments, 1):
        raise ValueError(f"{owner}(fragments={fragments!r}): expected the number of parts the parameters sync in, an "
                         f"int >= 1, or {AUTO!r} (min(sync_every, the trainable parameter tensors))")


def check_schedule(sync_every: int, warm_start: Any, fragments: Any, qsr_alpha: Any, max_sync_every: Any,
                   owner: str) -> None:
    """ValueError naming the setting of the options for short jobs that DiLoCo cannot run with (after
    check_settings; the number of fragments is checked against the model's parameters by DiLoCo)."""
    if not _int_at_least(warm_start, 0):
        raise ValueError(f"{owner}(warm_start={warm_start!r}): expected the synchronous inner steps at the start, an "
                         f"int >= 0")
    check_fragments(fragments, owner)
    if qsr_alpha is not None and not _positive_number(qsr_alpha):
        raise ValueError(f"{owner}(qsr_alpha={qsr_alpha!r}): expected a number > 0 (the H schedule's alpha), or "
                         f"None (H = sync_every throughout)")
    if qsr_alpha is None and max_sync_every is not None:
        raise ValueError(f"{owner}(max_sync_every={max_sync_every!r}): caps the H schedule, which is off; give "
                         f"qsr_alpha too, or leave max_sync_every None")
    if qsr_alpha is not None and max_sync_every is None:
        raise ValueError(f"{owner}(qsr_alpha={qsr_alpha!r}): the H schedule needs a cap, max_sync_every (an int >= "
                         f"sync_every={sync_every}): H grows without bound as the learning rate falls to 0")
    if max_sync_every is not None and (not _int_at_least(max_sync_every, 1) or max_sync_every < sync_every):
        raise ValueError(f"{owner}(max_sync_every={max_sync_every!r}): expected an int >= sync_every={sync_every} "
                         f"(the H schedule's cap)")
