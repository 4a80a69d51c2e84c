"""The 8-bit allreduce with error feedback, for DDP's gradients and DiLoCo's pseudo-gradients (docs/int8.md).

Values travel as int8 codes, one float32 scale per block of 256, a quarter of float32's bytes (NaN and Inf
travel as themselves). The engine sends each rank's values for segment k straight to rank k, which adds them in
float32 once, and sends the finished segment, encoded once, to every rank: the error does not grow with the
number of ranks, and every rank ends with the same bits. Error feedback: each rank keeps what its quantisation
lost (its residual) and adds it to its next call's values, so that nothing is lost for good.

    all_reduce(tensor, residual, op="avg", group=None) -> torch.distributed.Work
        tensor    float32, on the CPU, CUDA or MPS; the result replaces its values (as dist.all_reduce does).
                  CUDA and MPS tensors are read in place or staged as for every mccl collective, so the call
                  never waits for the device.
        residual  None (no error feedback), or a contiguous float32 CPU tensor of as many elements, zeros at
                  first, that the caller keeps between calls for the same values (ErrorFeedback holds them): the
                  engine adds it to the values it quantises and leaves in it the error of that quantisation.
        op        "avg" or "sum" (or torch.distributed.ReduceOp.AVG / SUM).
        Returns at once with a Work: wait() or get_future() (a Future of [tensor]), as for
        dist.all_reduce(async_op=True). Every rank of `group` calls it, in the same order as its other
        collectives on that group; `tensor` and `residual` stay untouched until the work completes. The group
        must be an mccl group (ValueError otherwise); tensors that are not float32 are a ValueError.

    ErrorFeedback()
        residual(key, tensor) -> the residual for `key` (zeros when new, or when the element count changed).
        state_dict() / load_state_dict(d): the residuals, for checkpoints that must resume exactly.

    Int8State(process_group=None), int8_hook(state, bucket)
        DDP's comm hook: ddp.register_comm_hook(Int8State(), int8_hook). Averages each bucket in 8 bits with
        error feedback per bucket. float16, bfloat16 and float64 buckets go through float32; other dtypes
        (complex, integer) are a ValueError naming the dtype.
"""
# No `from __future__ import annotations`: DDP compares int8_hook's annotations with the types themselves.
from typing import Any, Dict, Hashable, Optional

import torch
import torch.distributed as dist

from ._backend import required_backend

FLOATING = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_OPS = {"avg": dist.ReduceOp.AVG, "sum": dist.ReduceOp.SUM}


def all_reduce(tensor: torch.Tensor, residual: Optional[torch.Tensor], op: Any = "avg", group: Any = None):
    """The 8-bit allreduce of `tensor` with error feedback through `residual` (module docstring)."""
    backend = required_backend(group, "int8.all_reduce")
    if tensor.dtype != torch.float32:
        raise ValueError(f"lightning_mccl.int8.all_reduce takes float32 tensors, got {tensor.dtype} (convert it, "
                         f"as int8_hook does for float16, bfloat16 and float64)")
    if isinstance(op, str):
        if op not in _OPS:
            raise ValueError(f"lightning_mccl.int8.all_reduce: op={op!r}, expected 'avg' or 'sum'")
        op = _OPS[op]
    return backend.allreduce_int8(tensor, residual, op)


class ErrorFeedback:
    """Each rank's quantisation residuals, by key (a bucket's index, a parameter's name)."""

    def __init__(self) -> None:
        self._residuals: Dict[Hashable, torch.Tensor] = {}

    def residual(self, key: Hashable, tensor: torch.Tensor) -> torch.Tensor:
        """The residual kept for `key`: a float32 CPU tensor with `tensor`'s element count, zeros when new or when
        that count changed (DDP rebuilds its buckets after the first step)."""
        kept = self._residuals.get(key)
        if kept is None or kept.numel() != tensor.numel():
            kept = self._residuals[key] = torch.zeros(tensor.numel(), dtype=torch.float32)
        return kept

    def state_dict(self) -> Dict[Hashable, torch.Tensor]:
        return {k: v.clone() for k, v in self._residuals.items()}

    def load_state_dict(self, state: Dict[Hashable, torch.Tensor]) -> None:
        self._residuals = {k: v.detach().to("cpu", torch.float32).contiguous().clone() for k, v in state.items()}


class Int8State:
    """The state of int8_hook: the process group (None: the default group) and the residual of each bucket."""

    def __init__(self, process_group: Any = None) -> None:
        self.process_group = process_group
        self.feedback = ErrorFeedback()

    # DDP pickles comm hook states with the model only when asked to; the residuals are per process.
    def __getstate__(self) -> dict:
        return {"process_group": None, "feedback": ErrorFeedback()}


def int8_hook(state: Int8State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket averaged over the group in 8 bits with error feedback."""
    buffer = bucket.buffer()
    if buffer.dtype not in FLOATING:
        raise ValueError(f"lightning_mccl.int8 (compress='int8'): a DDP bucket of {buffer.dtype} gradients cannot "
                         f"travel in 8 bits; it takes floating-point gradients ({', '.join(map(str, FLOATING))})")
    wide = buffer if buffer.dtype == torch.float32 else buffer.float()
    residual = state.feedback.residual(bucket.index(), wide)
    future = all_reduce(wide, residual, "avg", state.process_group).get_future()
    if wide is buffer:
        return future.then(lambda done: done.value()[0])
    return future.then(lambda done: buffer.copy_(done.value()[0]))
