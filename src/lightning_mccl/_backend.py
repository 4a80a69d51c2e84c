"""Registration of the `mccl` backend with torch.distributed."""
from __future__ import annotations

import os
from datetime import timedelta

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


_engine_wire: "str | None" = None  # MCCL_WIRE_DTYPE of this process's first mccl group


def engine_wire_dtype():
    """MCCL_WIRE_DTYPE of this process's first mccl group (its options, else the environment then), or None
    before that. Each group reads its own settings when it is made (options.py)."""
    return _engine_wire


def _create_backend(opts, backend_options=None):
    """torch's extended-API creator: one ProcessGroupMCCL per process group and device. `backend_options`
    is the pg_options of init_process_group / new_group: lightning_mccl.Options or a dict (options.py)."""
    global _engine_wire
    settings = settings_of(backend_options)
    if _engine_wire is None:
        _engine_wire = settings.get("MCCL_WIRE_DTYPE", os.environ.get("MCCL_WIRE_DTYPE", "off"))
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
