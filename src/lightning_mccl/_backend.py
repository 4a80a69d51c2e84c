"""Registration of the `mccl` backend with torch.distributed."""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

from . import _C
from .options import settings_of

ProcessGroupMCCL = _C.ProcessGroupMCCL

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


_wire_by_group: "dict[str, str]" = {}  # torch's group name -> MCCL_WIRE_DTYPE its mccl backend read


def wire_dtype_of(group=None) -> "Optional[str]":
    """The MCCL_WIRE_DTYPE that `group`'s mccl backend read when it was made (its pg_options, else the
    environment then, else "off"); `group` defaults to the default group. None when torch.distributed is not
    initialized, or when the group is not an mccl group made by this backend (a Gloo group, say, even one that
    reuses the name of a destroyed mccl group). Each group reads its own settings when it is made
    (options.py), and keeps them."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    if group is None:
        group = dist.group.WORLD
    try:
        if dist.get_backend(group) != BACKEND_NAME:
            return None
    except (RuntimeError, ValueError):  # not a group of this process (destroyed, or another rank set's)
        return None
    return _wire_by_group.get(str(group.group_name))


def _create_backend(opts, backend_options=None):
    """torch's extended-API creator: one ProcessGroupMCCL per process group and device. `backend_options`
    is the pg_options of init_process_group / new_group: lightning_mccl.Options or a dict (options.py)."""
    settings = settings_of(backend_options)
    _wire_by_group[str(opts.group_id)] = settings.get("MCCL_WIRE_DTYPE", os.environ.get("MCCL_WIRE_DTYPE", "off"))
    timeout = opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    route_to = os.environ.get("MASTER_ADDR") or _store_host(opts.store)
    return ProcessGroupMCCL(opts.store, opts.group_rank, opts.group_size, timeout, route_to, settings)


def is_registered() -> bool:
    return BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {})


def register() -> None:
    """Registers `mccl` for cpu, cuda and mps tensors. Idempotent; also the entry point torch calls."""
    if is_registered():
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=DEVICES)
