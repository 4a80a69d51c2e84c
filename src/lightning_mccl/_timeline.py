"""`lightning_mccl.timeline(group)`: one process group's latest collectives one by one, with their times, and
`lightning_mccl.clock_ns()`: now in the clock of those times.

The timeline (csrc/engine/timeline.h) is a flight recorder like the trace buffer of torch's NCCL group: the
last MCCL_TIMELINE_ENTRIES collectives of the group (0 records none; docs/settings.md), failed ones included,
oldest first; send/recv are not collectives and are not in it. Recording costs the progress thread one copy
of an entry into a ring reserved up front; reading it copies the ring (without holding the GIL).

    [{"seq": 0, "kind": "allreduce", "bytes": 4000, "wire_bytes": 2000, "issued_ns": ..., "started_ns": ...,
      "ready_ns": ..., "done_ns": ...}, ...]

- seq: the collective's sequence number in the group (the same collective has the same seq on every rank).
- kind: "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "gather", "scatter", "alltoall",
  "barrier".
- bytes: element count x element size in the caller's dtype (before MCCL_WIRE_DTYPE compression): the buffer
  of allreduce, broadcast and reduce; one rank's block of allgather, reduce_scatter, gather and scatter; all
  that alltoall sends; 0 for a barrier.
- wire_bytes: the same payload in the type it travels in: half of bytes for a collective the group's
  MCCL_WIRE_DTYPE (bf16, fp16) compresses (float32 allreduce, reduce_scatter and reduce), else == bytes.
  (A bf16/fp16 DDP hook hands the engine 16-bit tensors: there bytes is already the halved size.)
- issued_ns to started_ns: queued behind earlier collectives, or held back by a future's callbacks (a gate);
  started_ns to ready_ns: the progress thread waiting for device copies into its buffers (none for CPU
  tensors: ready_ns == started_ns; a copy that failed counts until it failed); ready_ns to done_ns: running.

The times are nanoseconds of the engine's steady clock (CLOCK_MONOTONIC / mach_absolute_time), which
`clock_ns()` reads, so a caller marks a window (a training step) in the same clock and picks out its
collectives:

    start = lightning_mccl.clock_ns()
    ...  # the step
    end = lightning_mccl.clock_ns()
    step = [e for e in lightning_mccl.timeline() if start <= e["issued_ns"] <= end]

Read the timeline once after the steps of interest rather than after every step: each read copies the whole
ring, up to MCCL_TIMELINE_ENTRIES entries.
"""
from __future__ import annotations

from typing import Any, Optional

from . import _C
from .backend import required_backend

__all__ = ["clock_ns", "timeline"]


def timeline(group: Optional[Any] = None) -> list:
    """The latest collectives of `group`'s mccl backend (default: the world group), oldest first, as dicts with
    seq, kind, bytes, wire_bytes, issued_ns, started_ns, ready_ns and done_ns. Raises ValueError naming the cause
    when torch.distributed is not initialized or the group does not run on mccl."""
    return required_backend(group, "timeline").timeline()


def clock_ns() -> int:
    """Now in the steady clock of timeline() and of stats()' last_issued_ns / last_done_ns, in nanoseconds."""
    return _C.clock_ns()
