"""`MCCLStrategy(compress=...)`: how the gradients travel.

    "bf16", "fp16"            CPU training: the engine's wire compression (MCCL_WIRE_DTYPE): float32
                              gradients travel as bf16/fp16, each partial sum rounded once per hop, summed in
                              float32; every rank ends with the same bits; no Python hook. On an accelerator
                              (MPS, CUDA), and over another backend (Gloo as a reference): torch's compress
                              hook, which casts the bucket on the device, so that the staging copies through
                              host memory move half the bytes too: the faster of the two there
                              (docs/performance.md, "MCCLStrategy(compress=...)").
    "bf16_hook", "fp16_hook"  torch's `bf16_compress_hook` / `fp16_compress_hook` (the bucket cast in Python,
                              all-reduced as a 16-bit tensor); with a ddp_comm_hook, its `*_compress_wrapper`.
    "powersgd"                torch's `powerSGD_hook` with a `PowerSGDState` built from `compress_options`
                              (defaults below: rank 1, error feedback, warm start, PowerSGD from step 10, same-shaped
                              matrices batched).
    "int8"                    the engine's 8-bit allreduce with error feedback (lightning_mccl.int8, docs/int8.md):
                              lightning_mccl.int8.int8_hook with an Int8State, on every device; mccl only. Its
                              gradients must be floating-point (float16, bfloat16 and float64 travel through
                              float32): another dtype is a ValueError naming the parameter when DDP is set up.

A process group reads MCCL_WIRE_DTYPE when it is made (docs/settings.md): the strategy passes it in the
pg_options of the group it creates (`wire_settings`), never in the environment. A second fit in the same
process reuses that group, so another `compress` then is a ValueError naming the group's setting (what its
engine read), never a silent no-op, and so is `compress` unset when the group's setting is not the
environment's (never a silently compressed fit); after `torch.distributed.destroy_process_group()` a fit makes
a new group with its own setting.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

CHOICES = ("bf16", "fp16", "bf16_hook", "fp16_hook", "powersgd", "int8")
WIRE = ("bf16", "fp16")
WIRE_ENV = "MCCL_WIRE_DTYPE"
# batch_tensors_with_same_shape: one matrix product and orthogonalisation per shape (ViT-B/16: 4 shapes for its
# 48 block matrices), measured faster on the fleet stand-in (docs/performance.md, *DDP settings for fleets*).
POWERSGD_DEFAULTS: Dict[str, Any] = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 10,
                                     "use_error_feedback": True, "warm_start": True,
                                     "batch_tensors_with_same_shape": True}


@dataclass
class Plan:
    """What the strategy does for one `compress` choice: a wire type for the engine, or hook/state/wrapper."""

    wire: Optional[str] = None
    on_accelerator: Optional["Plan"] = None  # for a wire plan: what to do instead when gradients live on a device
    hook: Optional[Callable] = None
    wrapper: Optional[Callable] = None
    state: Optional[object] = None
    options: Dict[str, Any] = field(default_factory=dict)
    check: Optional[Callable] = None  # check(module) when DDP is set up: ValueError for parameters it cannot take


def plan(compress: Optional[str], options: Optional[dict], uses_mccl: bool, hook: Optional[Callable],
         wrapper: Optional[Callable], state: Optional[object]) -> Plan:
    """ValueError naming the argument for a bad choice, options that do not apply, or a clash with the hook
    arguments."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if compress is None:
        if options:
            raise ValueError("MCCLStrategy(compress_options=...) needs compress='powersgd'")
        return Plan(hook=hook, wrapper=wrapper, state=state)
    if compress not in CHOICES:
        raise ValueError(f"MCCLStrategy(compress={compress!r}): expected one of {CHOICES} or None")
    if options and compress != "powersgd":
        raise ValueError(f"MCCLStrategy(compress={compress!r}) takes no compress_options (only 'powersgd' does)")
    if compress in WIRE and uses_mccl:
        return Plan(wire=compress, hook=hook, wrapper=wrapper, state=state,
                    on_accelerator=plan(f"{compress}_hook", None, uses_mccl, hook, wrapper, state))
    if compress == "int8":
        return _int8_plan(uses_mccl, hook, wrapper, state)
    if compress == "powersgd":
        if hook is not None or state is not None:
            raise ValueError("MCCLStrategy(compress='powersgd') brings its own hook and state: leave ddp_comm_hook "
                             "and ddp_comm_state unset")
        unknown = sorted(set(options or {}) - set(_powersgd_parameters()))
        if unknown:
            raise ValueError(f"MCCLStrategy(compress_options=...): {unknown} are not PowerSGDState arguments "
                             f"({', '.join(_powersgd_parameters())})")
        opts = {**POWERSGD_DEFAULTS, **(options or {})}
        return Plan(hook=powerSGD_hook.powerSGD_hook, wrapper=wrapper, options=opts,
                    state=powerSGD_hook.PowerSGDState(process_group=None, **opts))
    half = compress.replace("_hook", "")
    hooks = {"bf16": (default_hooks.bf16_compress_hook, default_hooks.bf16_compress_wrapper),
             "fp16": (default_hooks.fp16_compress_hook, default_hooks.fp16_compress_wrapper)}[half]
    if hook is None:
        return Plan(hook=hooks[0], wrapper=wrapper, state=state)
    if wrapper is not None:
        raise ValueError(f"MCCLStrategy(compress={compress!r}) with both ddp_comm_hook and ddp_comm_wrapper: "
                         f"compress would replace the wrapper; give either compress or ddp_comm_wrapper")
    return Plan(hook=hook, wrapper=hooks[1], state=state)


def _int8_plan(uses_mccl: bool, hook: Optional[Callable], wrapper: Optional[Callable],
               state: Optional[object]) -> Plan:
    from lightning_mccl import int8

    if not uses_mccl:
        raise ValueError("MCCLStrategy(compress='int8') needs process_group_backend='mccl': the 8-bit allreduce is "
                         "the mccl engine's")
    if hook is not None or state is not None or wrapper is not None:
        raise ValueError("MCCLStrategy(compress='int8') brings its own hook and state: leave ddp_comm_hook, "
                         "ddp_comm_state and ddp_comm_wrapper unset")
    return Plan(hook=int8.int8_hook, state=int8.Int8State(), check=_int8_parameters)


def _int8_parameters(module) -> None:
    from lightning_mccl.int8 import FLOATING

    for name, p in module.named_parameters():
        if p.requires_grad and p.dtype not in FLOATING:
            raise ValueError(f"MCCLStrategy(compress='int8'): parameter {name!r} is {p.dtype}, whose gradients cannot "
                             f"travel in 8 bits; compress='int8' takes floating-point gradients "
                             f"({', '.join(map(str, FLOATING))})")


def _powersgd_parameters() -> list:
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    return [p for p in inspect.signature(powerSGD_hook.PowerSGDState.__init__).parameters
            if p not in ("self", "process_group")]


def wire_settings(wire: Optional[str], existing: Optional[str]) -> Dict[str, str]:
    """The pg_options settings that give a new mccl group the wire type `wire` (the plan's): {MCCL_WIRE_DTYPE:
    wire}, or {} when `wire` is None (compress unset: the environment decides, as without the strategy).
    `existing` is the MCCL_WIRE_DTYPE of the mccl default group that already exists and that Lightning will
    reuse (`_backend.wire_dtype_of()`: what its engine read), None when there is none. ValueError when the
    environment, or that group, says otherwise; with compress unset, when that group's setting is not the
    environment's (a fit after a compressed one would otherwise train compressed without asking). Every rank
    runs the same code, so every rank passes the same value; the engine checks that on the wire too. Never
    writes the environment."""
    if wire is None:
        env = os.environ.get(WIRE_ENV)
        have = None if existing is None else _normal(existing)
        if have is not None and have != _normal(env if env is not None else "off"):
            if have == "off":
                hint = f"remove {WIRE_ENV} from the environment"
            elif env is None:
                hint = f"pass compress={have!r}"
            else:
                hint = f"set {WIRE_ENV}={have}"
            raise ValueError(f"MCCLStrategy(compress=None): the existing default process group, which this fit "
                             f"reuses, was made with {WIRE_ENV}={existing}, but the environment says "
                             f"{WIRE_ENV}={env if env is not None else 'off (unset)'} (a group keeps what it read "
                             f"when it was made); call torch.distributed.destroy_process_group() before this fit, "
                             f"or {hint} to train as that group does")
        return {}
    want = _normal(wire)
    env = os.environ.get(WIRE_ENV)
    if env is not None and _normal(env) != want:
        raise ValueError(f"MCCLStrategy(compress={wire!r}) but {WIRE_ENV}={env} in the environment: remove the "
                         f"variable or make them agree")
    if existing is not None and _normal(existing) != want:
        raise ValueError(f"MCCLStrategy(compress={wire!r}): the existing default process group, which this fit "
                         f"reuses, was made with {WIRE_ENV}={existing} (a group keeps what it read when it was "
                         f"made); call torch.distributed.destroy_process_group() before this fit, or use the same "
                         f"compress")
    return {WIRE_ENV: wire}


def _normal(value: str) -> str:
    """An MCCL_WIRE_DTYPE value as the engine reads it, by its usual name ("off", "bf16", ...); ValueError naming
    the variable for a value the engine does not take."""
    from lightning_mccl._C import wire_type

    return wire_type(value)
