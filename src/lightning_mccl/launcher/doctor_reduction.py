"""`mccl doctor`'s "Reduction path" table: on every rank, how reductions run, and why.

- CPU reducer: the vector instructions the engine's kernels run with (reported by the engine itself:
  AVX2 or SSE2 chosen at run time on x86-64, NEON with hardware float16 conversion on arm64).
- MPS tensors: read and written in place (shared storage: the CPU addresses the same memory) or staged
  through reused host buffers, and why: the answer of the binding itself (csrc/torch/host_memory.hpp)
  for a tensor the size of a gradient bucket, allocated by torch's MPS allocator as training's are.
- MPS per-value work (the 8-bit path's encode and decode, DiLoCo's): the Metal kernels, or torch ops and why,
  as the group chose (`lightning_mccl.metal.describe`: every rank of a group takes the same path).

reports() runs on every rank of the doctor's measurement (doctor_bench), after the process group is up;
table() renders rank 0's gathered list.
"""
from __future__ import annotations

import platform
import socket
from typing import List, Sequence

from rich.markup import escape
from rich.table import Table


def cpu_vector_path() -> str:
    from lightning_mccl.backend import extension as _C

    fn = getattr(_C, "reduce_vector_path", None)
    return fn() if fn is not None else "unknown (this build of lightning_mccl._C does not report it)"


# The probe's size: DDP's default gradient bucket (25 MiB), which torch's MPS allocator places like training's.
PROBE_BYTES = 25 << 20


def mps_probe():
    import torch

    return torch.empty(PROBE_BYTES // 4, dtype=torch.float32, device="mps")


def mps_path() -> str:
    import torch

    from lightning_mccl.backend import extension as _C

    if not torch.backends.mps.is_available():
        return "no MPS device"
    fn = getattr(_C, "device_memory_path", None)
    if fn is None:
        return "staged through host buffers (this build of lightning_mccl._C does not report why)"
    in_place, why = fn(mps_probe())
    return f"in place: {why}" if in_place else f"staged through reused host buffers: {why}"


def metal_path() -> str:
    from lightning_mccl.metal import describe

    try:
        return describe()
    except Exception as e:  # a report, not a reason to stop the doctor's other tables
        return f"unknown ({type(e).__name__}: {e})"


def reports(dist) -> List[dict]:
    """Every rank's report, in rank order (a collective: every rank must call it)."""
    from lightning_mccl.rendezvous import launcher_hosts

    hosts = launcher_hosts(dist.get_world_size())  # the launcher's names, as its [host rN] prefixes say
    mine = {"host": hosts[dist.get_rank()] if hosts else socket.gethostname(), "machine": platform.machine(),
            "cpu": cpu_vector_path(), "mps": mps_path(), "metal": metal_path()}
    everyone: List[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(everyone, mine)
    return everyone


def table(rows: Sequence[dict]) -> Table:
    t = Table(title="Reduction path (per rank)", title_justify="left")
    for col in ("rank", "host", "CPU reducer", "MPS tensors", "MPS per-value work"):
        t.add_column(col)
    for rank, r in enumerate(rows):
        t.add_row(str(rank), escape(f"{r['host']} ({r['machine']})"), escape(r["cpu"]), escape(r["mps"]),
                  escape(r.get("metal", "")))
    return t
