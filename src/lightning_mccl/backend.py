"""The `mccl` backend as torch.distributed sees it: `ProcessGroupMCCL`, the creator torch calls for each new group,
and how to find the mccl backend behind a group. Registering it with torch is registration.py's."""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from . import _C, metal
from .options import settings_of

ProcessGroupMCCL = _C.ProcessGroupMCCL
# The compiled extension itself, for what reads the engine's internals through it: its settings table, the
# codecs' and Metal arithmetic's reference builds, the reduction path, the interfaces (tests, tools, the doctor).
extension = _C

BACKEND_NAME = "mccl"
DEVICES = ["cpu", "cuda", "mps"]


def _store_host(store) -> str:
    """The TCPStore host under torch's PrefixStore wrappers, if any: where MASTER_ADDR points."""
    seen = 0
    while store is not None and seen < 16:
        host = getattr(store, "host", None)
        if host:
            return host
        store = getattr(store, "underlying_store", None)
        seen += 1
    return ""


def mccl_backend(group: Optional[Any] = None) -> "Optional[ProcessGroupMCCL]":
    """The ProcessGroupMCCL behind `group` (default: the world group), or None when it is not an mccl group."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    pg = group if group is not None else dist.group.WORLD
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, ValueError, AttributeError):
        return None
    return backend if isinstance(backend, ProcessGroupMCCL) else None


def required_backend(group: Optional[Any], caller: str) -> "ProcessGroupMCCL":
    """mccl_backend(group), or a ValueError from `lightning_mccl.<caller>` naming why there is none."""
    backend = mccl_backend(group)
    if backend is not None:
        return backend
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"lightning_mccl.{caller}: torch.distributed is not initialized")
    try:
        name = dist.get_backend(group)
    except (RuntimeError, ValueError):
        raise ValueError(f"lightning_mccl.{caller}: the group is not a process group of this process (destroyed, "
                         f"or made without this rank)") from None
    raise ValueError(f"lightning_mccl.{caller}: the group's backend is {name!r}, not mccl")


def wire_dtype_of(group=None) -> "Optional[str]":
    """The MCCL_WIRE_DTYPE that `group`'s mccl backend read when it was made (its pg_options, else the
    environment then, else off), as the engine parsed it: "off", "bf16" or "fp16"; `group` defaults to the
    default group. None when torch.distributed is not initialized, or when the group is not an mccl group.
    Each group reads its own settings when it is made (options.py), and keeps them."""
    backend = mccl_backend(group)
    return None if backend is None else backend.wire_dtype


def create_backend(opts, backend_options=None):
    """torch's extended-API creator: one ProcessGroupMCCL per process group and device. `backend_options`
    is the pg_options of init_process_group / new_group: lightning_mccl.Options or a dict (options.py)."""
    settings = settings_of(backend_options)
    timeout = opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    route_to = os.environ.get("MASTER_ADDR") or _store_host(opts.store)
    metal_setting = metal.setting()  # a bad MCCL_METAL fails here, before the ranks connect
    backend = ProcessGroupMCCL(opts.store, opts.group_rank, opts.group_size, timeout, route_to, settings)
    metal.agree(backend, opts.store, opts.group_rank, opts.group_size, metal_setting)  # Metal kernels: all or none
    return backend


def wire_type(value: str) -> str:
    """An MCCL_WIRE_DTYPE value as the engine reads it, by its usual name ("off", "bf16", ...); ValueError naming
    the variable for a value the engine does not take."""
    return _C.wire_type(value)
