"""`lightning_mccl.stats(group)`: the engine's traffic counters of one process group.

Counted by the engine on every operation, always on (relaxed atomic adds; see csrc/engine/stats.h):

    {"kinds": {"allreduce": {"calls": 12, "bytes_sent": ..., "bytes_received": ..., "busy_ns": ..., "wait_ns": ...},
               "broadcast": {...}, "send/recv": {...}},
     "last_issued_ns": ..., "last_done_ns": ...}

- bytes_sent / bytes_received: payload bytes this rank put on / took off the wire, after compression
  (MCCL_WIRE_DTYPE, or a bf16/fp16 DDP hook, which hands the engine half-size tensors); headers not included.
- busy_ns: time in flight, from the start of each operation on the engine's progress thread to its completion.
- wait_ns: time callers spent blocked in `work.wait()` (blocking calls included). DDP waits on futures instead,
  so its gradient allreduces show here as 0; `last_issued_ns`/`last_done_ns` (steady clock, the latest
  collective's issue and completion) tell how long the last one of a step kept the loop waiting.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from ._backend import ProcessGroupMCCL

FIELDS = ("calls", "bytes_sent", "bytes_received", "busy_ns", "wait_ns")


def mccl_backend(group: Optional[Any] = None) -> Optional[ProcessGroupMCCL]:
    """The ProcessGroupMCCL behind `group` (default: the world group), or None when it is not an mccl group."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    pg = group if group is not None else dist.group.WORLD
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, ValueError):
        return None
    return backend if isinstance(backend, ProcessGroupMCCL) else None


def stats(group: Optional[Any] = None) -> dict:
    """The counters of `group`'s mccl backend (default: the world group). Raises ValueError when torch.distributed
    is not initialised or the group does not run on mccl."""
    backend = mccl_backend(group)
    if backend is None:
        state = "not initialised" if not (dist.is_available() and dist.is_initialized()) else "not an mccl group"
        raise ValueError(f"lightning_mccl.stats: no mccl backend ({'torch.distributed is ' + state})")
    return backend.stats()


def totals(snapshot: dict) -> dict:
    """The counters of a stats() snapshot summed over the collective kinds."""
    out = dict.fromkeys(FIELDS, 0)
    for row in snapshot["kinds"].values():
        for field in FIELDS:
            out[field] += row[field]
    return out
