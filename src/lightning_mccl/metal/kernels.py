"""The Metal reduction kernels: reduce_arith.h (the arithmetic, shared with the C++ tests) plus one kernel
per (dtype, op), compiled at run time through torch's MPS shader library (torch.mps.compile_shader, public
since torch 2.7). Nothing Metal is compiled when the package is built, so this can never break an install.

MetalReducer.reduce_(dst, src, op) computes dst = dst OP src in place on MPS tensors of float32, float16 or
bfloat16 (the half types travel as 16-bit integers: the header does the conversions, bit-exactly). AVG
reduces like SUM; the division stays on the CPU like everywhere else in MCCL.
"""
from __future__ import annotations

import platform
from pathlib import Path
from typing import Optional

HEADER = Path(__file__).with_name("reduce_arith.h")
OPS = {"sum": "MCCL_OP_SUM", "avg": "MCCL_OP_SUM", "product": "MCCL_OP_PRODUCT", "min": "MCCL_OP_MIN",
       "max": "MCCL_OP_MAX"}
# dtype name -> (MSL storage type, per-element function of reduce_arith.h)
TYPES = {"float32": ("float", "mccl_reduce_f32"), "float16": ("ushort", "mccl_reduce_f16"),
         "bfloat16": ("ushort", "mccl_reduce_bf16")}
KERNEL = """
kernel void mccl_{dtype}_{op}(device {storage}* dst [[buffer(0)]], device const {storage}* src [[buffer(1)]],
                              uint i [[thread_position_in_grid]]) {{
  dst[i] = {fn}({code}, dst[i], src[i]);
}}
"""


def kernel_name(dtype: str, op: str) -> str:
    return f"mccl_{dtype}_{'sum' if op == 'avg' else op}"


def msl_source() -> str:
    """The whole Metal library: the header, then every kernel."""
    kernels = [KERNEL.format(dtype=dtype, op=op, storage=storage, fn=fn, code=OPS[op])
               for dtype, (storage, fn) in TYPES.items() for op in OPS if op != "avg"]
    return HEADER.read_text() + "".join(kernels)


def unavailable_reason() -> Optional[str]:
    """Why Metal cannot be used in this process, or None when it can be tried."""
    if platform.system() != "Darwin":
        return f"not macOS ({platform.system()})"
    import torch

    if not torch.backends.mps.is_available():
        return "torch.backends.mps.is_available() is False"
    if not hasattr(torch.mps, "compile_shader"):
        return f"torch {torch.__version__} has no torch.mps.compile_shader (needs 2.7 or later)"
    return None


class MetalReducer:
    """dst = dst OP src on MPS tensors, through kernels compiled on first use."""

    name = "metal"
    device = "mps"

    def __init__(self):
        self._library = None

    def unavailable_reason(self) -> Optional[str]:
        return unavailable_reason()

    def _lib(self):
        if self._library is None:
            import torch

            self._library = torch.mps.compile_shader(msl_source())
        return self._library

    def reduce_(self, dst, src, op: str) -> None:
        import torch

        dtype = str(dst.dtype).replace("torch.", "")
        if dtype not in TYPES or op not in OPS:
            raise ValueError(f"metal reduce: {op} on {dtype} is not supported (float32/float16/bfloat16; "
                             f"{', '.join(OPS)})")
        if (dst.shape != src.shape or dst.dtype != src.dtype or dst.device.type != "mps" or src.device.type != "mps"
                or not dst.is_contiguous() or not src.is_contiguous()):
            raise ValueError(f"metal reduce: dst {tuple(dst.shape)} {dst.dtype} on {dst.device} and src "
                             f"{tuple(src.shape)} {src.dtype} on {src.device} differ, or are not contiguous on mps")
        if dst.numel() == 0:
            return
        if dtype != "float32":  # 16-bit storage: the kernel sees the bits
            dst, src = dst.view(torch.int16), src.view(torch.int16)
        getattr(self._lib(), kernel_name(dtype, op))(dst, src, threads=dst.numel())
