"""`lightning_mccl.stats(group)`: the engine's traffic counters of one process group (its collectives one by
one, with their times, are `lightning_mccl.timeline(group)`: _timeline.py).

Counted by the engine on every operation, always on (relaxed atomic adds; see csrc/engine/stats.h):

    {"kinds": {"allreduce": {"calls": 12, "bytes_sent": ..., "bytes_received": ..., "busy_ns": ..., "wait_ns": ...},
               "broadcast": {...}, "send/recv": {...}},
     "last_issued_ns": ..., "last_done_ns": ...}

- bytes_sent / bytes_received: payload bytes this rank put on / took off the wire, after compression
  (MCCL_WIRE_DTYPE, or a bf16/fp16 DDP hook, which hands the engine half-size tensors); headers not included.
- busy_ns: time in flight, from the start of each operation on the engine's progress thread to its completion.
- wait_ns: time callers spent blocked in `work.wait()` (blocking calls included). DDP waits on futures instead,
  so its gradient allreduces show here as 0; `last_issued_ns`/`last_done_ns` (the steady clock of
  `lightning_mccl.clock_ns()`, the latest collective's issue and completion) tell how long the last one of a
  step kept the loop waiting. The timeline keeps the last MCCL_TIMELINE_ENTRIES collectives' own times.
"""
from __future__ import annotations

from typing import Any, Optional

from .backend import ProcessGroupMCCL, mccl_backend, required_backend  # noqa: F401 - mccl_backend: public here

FIELDS = ("calls", "bytes_sent", "bytes_received", "busy_ns", "wait_ns")


def stats(group: Optional[Any] = None) -> dict:
    """The counters of `group`'s mccl backend (default: the world group). Raises ValueError naming the cause when
    torch.distributed is not initialized or the group does not run on mccl."""
    return required_backend(group, "stats").stats()


def totals(snapshot: dict) -> dict:
    """The counters of a stats() snapshot summed over the collective kinds."""
    out = dict.fromkeys(FIELDS, 0)
    for row in snapshot["kinds"].values():
        for field in FIELDS:
            out[field] += row[field]
    return out
