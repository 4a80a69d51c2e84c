"""The 8-bit allreduce with error feedback, for DDP's gradients and DiLoCo's pseudo-gradients (docs/int8.md).

Values travel as int8 codes, one float32 scale per block of 256, a quarter of float32's bytes (NaN and Inf
travel as themselves). The engine sends each rank's values for segment k straight to rank k, which adds them in
float32 once, and sends the finished segment, encoded once, to every rank: the error does not grow with the
number of ranks, and every rank ends with the same bits. Error feedback: each rank keeps what its quantisation
lost (its residual) and adds it to its next call's values, so that nothing is lost for good.

Where the per-value work runs (`codec`): for a CUDA or MPS tensor, torch ops on its device add the residual,
encode and decode (the engine gets the encoded values: a quarter of the bytes to stage, and only the sums of the
values this rank owns to compute); for a CPU tensor, the engine's vector code does it all. Both give the same
bytes, so the same results and residuals, bit for bit.

    all_reduce(tensor, residual, op="avg", group=None, codec="auto") -> torch.distributed.Work
        tensor    float32, on the CPU, CUDA or MPS; the result replaces its values (as dist.all_reduce does).
                  The call never waits for the device: its device work is queued on mccl's staging stream,
                  after the current stream's (docs/staging.md), and the Work's future orders its consumers.
        residual  None (no error feedback), or a contiguous float32 tensor of as many elements, zeros at first,
                  on the device where the codec runs (residual_device(tensor, codec): the tensor's own device,
                  or the CPU for codec="engine"), that the caller keeps between calls for the same values
                  (ErrorFeedback holds them). It is added to the values before they are encoded, and then holds
                  what this rank's encodings lost, which the next call adds back.
        op        "avg" or "sum" (or torch.distributed.ReduceOp.AVG / SUM).
        codec     "auto": torch ops on an accelerator tensor's device, the engine for a CPU tensor; "torch":
                  torch ops wherever the tensor is (the CPU too); "engine": the engine for every tensor (an
                  accelerator's staged as float32, as every collective stages it).
        Returns at once with a Work: wait() or get_future() (a Future of [tensor]), as for
        dist.all_reduce(async_op=True). Every rank of `group` calls it, in the same order as its other
        collectives on that group (ranks may use different codecs); `tensor` and `residual` stay untouched until
        the work completes. The group must be an mccl group (ValueError otherwise); tensors that are not float32
        are a ValueError.

    residual_device(tensor, codec="auto") -> torch.device: where all_reduce wants `tensor`'s residual.

    ErrorFeedback()
        residual(key, tensor, device=None) -> the residual for `key` on `device` (default: the tensor's device):
            zeros when new, or when the element count changed; moved there when it was kept elsewhere (loaded
            from a checkpoint, say).
        state_dict() / load_state_dict(d): the residuals, for checkpoints that must resume exactly.

    Int8State(process_group=None, codec="auto"), int8_hook(state, bucket)
        DDP's comm hook: ddp.register_comm_hook(Int8State(), int8_hook). Averages each bucket in 8 bits with
        error feedback per bucket. float16, bfloat16 and float64 buckets go through float32; other dtypes
        (complex, integer) are a ValueError naming the dtype.
"""
# No `from __future__ import annotations`: DDP compares int8_hook's annotations with the types themselves.
from typing import Any, Dict, Hashable, Optional

import torch
import torch.distributed as dist

from . import metal
from .backend import required_backend

FLOATING = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CODECS = ("auto", "torch", "engine")
_OPS = {"avg": dist.ReduceOp.AVG, "sum": dist.ReduceOp.SUM}


def _checked(codec: str, caller: str) -> str:
    if codec not in CODECS:
        raise ValueError(f"lightning_mccl.int8.{caller}: codec={codec!r}, expected one of "
                         f"{', '.join(map(repr, CODECS))}")
    return codec


def _on_device(tensor: torch.Tensor, codec: str) -> bool:
    """Whether torch ops on the tensor's device do its per-value work (else the engine does)."""
    return _checked(codec, "all_reduce") == "torch" or (codec == "auto" and tensor.device.type != "cpu")


def residual_device(tensor: torch.Tensor, codec: str = "auto") -> torch.device:
    """Where all_reduce(tensor, residual, codec=codec) does the per-value work, and so wants the residual."""
    return tensor.device if _on_device(tensor, codec) else torch.device("cpu")


def all_reduce(tensor: torch.Tensor, residual: Optional[torch.Tensor], op: Any = "avg", group: Any = None,
               codec: str = "auto"):
    """The 8-bit allreduce of `tensor` with error feedback through `residual` (module docstring)."""
    backend = required_backend(group, "int8.all_reduce")
    if tensor.dtype != torch.float32:
        raise ValueError(f"lightning_mccl.int8.all_reduce takes float32 tensors, got {tensor.dtype} (convert it, "
                         f"as int8_hook does for float16, bfloat16 and float64)")
    if isinstance(op, str):
        if op not in _OPS:
            raise ValueError(f"lightning_mccl.int8.all_reduce: op={op!r}, expected 'avg' or 'sum'")
        op = _OPS[op]
    on_device = _on_device(tensor, codec)
    work = metal.allreduce_int8(backend, tensor, residual, op) if on_device else None  # MPS: lightning_mccl.metal
    return work if work is not None else backend.allreduce_int8(tensor, residual, op, on_device)


class ErrorFeedback:
    """Each rank's quantisation residuals, by key (a bucket's index, a parameter's name)."""

    def __init__(self) -> None:
        self._residuals: Dict[Hashable, torch.Tensor] = {}

    def residual(self, key: Hashable, tensor: torch.Tensor, device: Optional[torch.device] = None) -> torch.Tensor:
        """The residual kept for `key`: a float32 tensor with `tensor`'s element count on `device` (default: the
        tensor's), zeros when new or when that count changed (DDP rebuilds its buckets after the first step)."""
        device = tensor.device if device is None else torch.device(device)
        kept = self._residuals.get(key)
        if kept is None or kept.numel() != tensor.numel():
            kept = self._residuals[key] = torch.zeros(tensor.numel(), dtype=torch.float32, device=device)
        elif kept.device != device:
            kept = self._residuals[key] = kept.to(device)
        return kept

    def state_dict(self) -> Dict[Hashable, torch.Tensor]:
        return {k: v.clone() for k, v in self._residuals.items()}

    def load_state_dict(self, state: Dict[Hashable, torch.Tensor]) -> None:
        self._residuals = {k: v.detach().to(dtype=torch.float32).contiguous().clone() for k, v in state.items()}


class Int8State:
    """The state of int8_hook: the process group (None: the default group), where the per-value work runs
    (`codec`, as all_reduce takes it) and the residual of each bucket."""

    def __init__(self, process_group: Any = None, codec: str = "auto") -> None:
        self.process_group = process_group
        self.codec = _checked(codec, "Int8State")
        self.feedback = ErrorFeedback()

    # DDP pickles comm hook states with the model only when asked to; the residuals are per process.
    def __getstate__(self) -> dict:
        return {"process_group": None, "codec": self.codec, "feedback": ErrorFeedback()}


def int8_hook(state: Int8State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket averaged over the group in 8 bits with error feedback."""
    buffer = bucket.buffer()
    if buffer.dtype not in FLOATING:
        raise ValueError(f"lightning_mccl.int8 (compress='int8'): a DDP bucket of {buffer.dtype} gradients cannot "
                         f"travel in 8 bits; it takes floating-point gradients ({', '.join(map(str, FLOATING))})")
    wide = buffer if buffer.dtype == torch.float32 else buffer.float()
    residual = state.feedback.residual(bucket.index(), wide, residual_device(wide, state.codec))
    future = all_reduce(wide, residual, "avg", state.process_group, state.codec).get_future()
    if wide is buffer:
        return future.then(lambda done: done.value()[0])
    return future.then(lambda done: buffer.copy_(done.value()[0]))
