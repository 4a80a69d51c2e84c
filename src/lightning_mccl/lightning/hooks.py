"""DDP's comm hook for a strategy's `compress`: built from the wire policy's resolution (wire_policy.py), which
alone decides what each value does; this module only turns its answer into torch's hook, state and wrapper.

    check(...)   at the strategy's construction: a bad `compress`, options that do not apply, or a clash with the
                 strategy's own hook arguments is a ValueError naming the argument, before any fit starts
    build(...)   at setup, once the device is known: the hook, wrapper and state DDP registers, and a check of the
                 module's parameters (the 8-bit allreduce takes floating-point gradients only); for PowerSGD, a
                 warning on rank 0 that it changes the arithmetic, with what it cost on the benchmark task
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from .. import wire_policy
from ..accuracy_costs import AccuracyCostWarning, powersgd_warning
from ..wire_policy import CAST, EIGHT_BIT, LOW_RANK, Resolution


@dataclass(frozen=True)
class Hook:
    """What DDP registers for one resolution: hook, wrapper and state (None: none), and a check of the module."""

    hook: Optional[Callable] = None
    wrapper: Optional[Callable] = None
    state: Optional[object] = None
    check: Optional[Callable[[Any], None]] = None


def check(owner: str, compress: Optional[str], options: Optional[dict], backend: Optional[str],
          hook: Optional[Callable], wrapper: Optional[Callable], state: Optional[object]) -> Dict[str, Any]:
    """ValueError naming the argument for a bad choice, options that do not apply, or a clash with the hook
    arguments; returns the hook's options (the row's defaults updated by `options`)."""
    row = wire_policy.row(compress, owner)
    if options and row.options is None:
        raise ValueError(f"{owner}(compress={compress!r}) takes no compress_options (only "
                         f"{' and '.join(repr(c) for c, r in wire_policy.ROWS.items() if r.options)} do)")
    if row.mccl_only and backend != wire_policy.MCCL:
        raise ValueError(f"{owner}(compress={compress!r}) needs process_group_backend='mccl': the 8-bit allreduce "
                         f"is the mccl engine's")
    if row.hook in (LOW_RANK, EIGHT_BIT) and (hook is not None or state is not None
                                             or (row.hook == EIGHT_BIT and wrapper is not None)):
        unset = "ddp_comm_hook, ddp_comm_state and ddp_comm_wrapper" if row.hook == EIGHT_BIT else \
            "ddp_comm_hook and ddp_comm_state"
        raise ValueError(f"{owner}(compress={compress!r}) brings its own hook and state: leave {unset} unset")
    if row.hook == CAST and hook is not None and wrapper is not None:
        raise ValueError(f"{owner}(compress={compress!r}) with both ddp_comm_hook and ddp_comm_wrapper: compress "
                         f"would replace the wrapper; give either compress or ddp_comm_wrapper")
    if row.hook == LOW_RANK:
        known = _powersgd_parameters()
        unknown = sorted(set(options or {}) - set(known))
        if unknown:
            raise ValueError(f"{owner}(compress_options=...): {unknown} are not PowerSGDState arguments "
                             f"({', '.join(known)})")
    return {**(row.options or {}), **(options or {})}


def build(owner: str, resolution: Resolution, options: Dict[str, Any], hook: Optional[Callable],
          wrapper: Optional[Callable], state: Optional[object]) -> Hook:
    """The hook for `resolution` (with the strategy's own hook arguments, which `check` accepted)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if resolution.hook == CAST:
        compress_hook, compress_wrapper = {
            wire_policy.BF16: (default_hooks.bf16_compress_hook, default_hooks.bf16_compress_wrapper),
            wire_policy.FP16: (default_hooks.fp16_compress_hook, default_hooks.fp16_compress_wrapper)}[resolution.cast]
        if hook is None:
            return Hook(compress_hook, wrapper, state)
        return Hook(hook, compress_wrapper, state)
    if resolution.hook == LOW_RANK:
        from lightning.fabric.utilities.rank_zero import rank_zero_warn

        rank_zero_warn(powersgd_warning(options["matrix_approximation_rank"]), category=AccuracyCostWarning)
        return Hook(powerSGD_hook.powerSGD_hook, wrapper, powerSGD_hook.PowerSGDState(process_group=None, **options))
    if resolution.hook == EIGHT_BIT:
        from .. import int8

        return Hook(int8.int8_hook, None, int8.Int8State(), lambda module: _floating_parameters(owner, module))
    return Hook(hook, wrapper, state)


def _floating_parameters(owner: str, module: Any) -> None:
    from ..int8 import FLOATING

    for name, p in module.named_parameters():
        if p.requires_grad and p.dtype not in FLOATING:
            raise ValueError(f"{owner}(compress={wire_policy.INT8!r}): parameter {name!r} is {p.dtype}, whose "
                             f"gradients cannot travel in 8 bits; it takes floating-point gradients "
                             f"({', '.join(map(str, FLOATING))})")


def _powersgd_parameters() -> list:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    return [p for p in inspect.signature(powerSGD_hook.PowerSGDState.__init__).parameters
            if p not in ("self", "process_group")]
