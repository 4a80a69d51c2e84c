"""`lightning_mccl.stats(group)`: the engine's traffic counters of one process group, and
`lightning_mccl.timeline(group)`: its latest collectives one by one, with their times.

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

The timeline (csrc/engine/timeline.h) is a flight recorder like the trace buffer of torch's NCCL group: the
last MCCL_TIMELINE_ENTRIES collectives (default 2048; 0 records none), failed ones included, oldest first;
send/recv are not collectives and are not in it.

    [{"seq": 0, "kind": "allreduce", "bytes": 4000, "issued_ns": ..., "started_ns": ..., "ready_ns": ...,
      "done_ns": ...}, ...]

- seq: the collective's sequence number in the group (the same collective has the same seq on every rank).
- bytes: element count x element size in the caller's dtype (before MCCL_WIRE_DTYPE compression): the buffer
  of allreduce, broadcast and reduce; one rank's block of allgather, reduce_scatter, gather and scatter; all
  that alltoall sends; 0 for a barrier.
- issued_ns to started_ns: queued behind earlier collectives, or held back by a future's callbacks (a gate);
  started_ns to ready_ns: the progress thread waiting for device copies into its buffers (none for CPU
  tensors: ready_ns == started_ns); ready_ns to done_ns: running.

The times are nanoseconds of the steady clock that `clock_ns()` reads, so a caller can mark a window (a
training step) in the same clock and pick out its collectives.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from . import _C
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


def _required_backend(group: Optional[Any], caller: str) -> ProcessGroupMCCL:
    backend = mccl_backend(group)
    if backend is None:
        state = "not initialised" if not (dist.is_available() and dist.is_initialized()) else "not an mccl group"
        raise ValueError(f"lightning_mccl.{caller}: no mccl backend ({'torch.distributed is ' + state})")
    return backend


def stats(group: Optional[Any] = None) -> dict:
    """The counters of `group`'s mccl backend (default: the world group). Raises ValueError when torch.distributed
    is not initialised or the group does not run on mccl."""
    return _required_backend(group, "stats").stats()


def timeline(group: Optional[Any] = None) -> list:
    """The latest collectives of `group`'s mccl backend (default: the world group), oldest first, as dicts with
    seq, kind, bytes, issued_ns, started_ns, ready_ns and done_ns. Raises ValueError like stats()."""
    return _required_backend(group, "timeline").timeline()


def clock_ns() -> int:
    """Now in the steady clock of timeline() and of stats()' last_issued_ns / last_done_ns, in nanoseconds."""
    return _C.clock_ns()


def totals(snapshot: dict) -> dict:
    """The counters of a stats() snapshot summed over the collective kinds."""
    out = dict.fromkeys(FIELDS, 0)
    for row in snapshot["kinds"].values():
        for field in FIELDS:
            out[field] += row[field]
    return out
