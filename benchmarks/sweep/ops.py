"""The collectives a sweep measures, with nccl-tests' conventions for size and bus bandwidth.

size (the "size" column) is, as in nccl-tests: the buffer for allreduce and broadcast, the gathered output
for allgather, the input for reduce_scatter and alltoall. algbw = size / time; busbw = algbw x factor, the
factor that makes busbw comparable to the link speed whatever the algorithm:

    allreduce 2(n-1)/n     allgather, reduce_scatter, alltoall (n-1)/n     broadcast, reduce 1

allreduce_int8 is mccl's 8-bit allreduce (lightning_mccl.int8, no error feedback here) of float32 data: size
and busbw count the float32 buffer, as for allreduce, so the two compare directly (its wire carries a little
over a quarter of those bytes).

reduce is checked on its root (rank 0) only: torch leaves the other ranks' buffers undefined.

Inputs: rank r's element j is v_r[j] = x[j] (1 + r) + r / 4, with x drawn from a seed every rank shares, so
every rank can compute any rank's input, and its own expected output in float64, without communicating.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict

import torch
import torch.distributed as dist

SEED = 1234
CHECK_CHUNK = 1 << 20  # elements of the float64 reference computed at a time


@dataclass(frozen=True)
class OpSpec:
    name: str
    bus_factor: Callable[[int], float]
    sharded: bool  # the size splits into n equal parts


OPS: Dict[str, OpSpec] = {
    "allreduce": OpSpec("allreduce", lambda n: 2 * (n - 1) / n, False),
    "allreduce_int8": OpSpec("allreduce_int8", lambda n: 2 * (n - 1) / n, False),
    "allgather": OpSpec("allgather", lambda n: (n - 1) / n, True),
    "reduce_scatter": OpSpec("reduce_scatter", lambda n: (n - 1) / n, True),
    "broadcast": OpSpec("broadcast", lambda n: 1.0, False),
    "reduce": OpSpec("reduce", lambda n: 1.0, False),
    "alltoall": OpSpec("alltoall", lambda n: (n - 1) / n, True),
}


def element_count(op: str, size_bytes: int, world: int, esize: int) -> int:
    """Elements of the `size` buffer: whole elements, and a multiple of the world size for sharded ops."""
    count = size_bytes // esize
    if OPS[op].sharded:
        count -= count % world
    return count


class Buffers:
    """Input and output of one op at one size on one rank, and the check of a result against float64."""

    def __init__(self, op: str, count: int, rank: int, world: int, dtype: torch.dtype):
        self.op, self.count, self.rank, self.world, self.dtype = op, count, rank, world, dtype
        g = torch.Generator().manual_seed(SEED + count)
        self.x = torch.randn(count, generator=g, dtype=torch.float32)
        shard = count // world if OPS[op].sharded else count
        if op == "allgather":
            self.inp = torch.empty(shard, dtype=dtype)
            self.out = torch.empty(count, dtype=dtype)
        elif op == "reduce_scatter":
            self.inp = torch.empty(count, dtype=dtype)
            self.out = torch.empty(shard, dtype=dtype)
        elif op == "alltoall":
            self.inp = torch.empty(count, dtype=dtype)
            self.out = torch.empty(count, dtype=dtype)
        else:  # allreduce (int8 too), broadcast, reduce: in place
            self.inp = torch.empty(count, dtype=dtype)
            self.out = self.inp
        self.shard = shard

    def values(self, r: int, lo: int, hi: int) -> torch.Tensor:
        """v_r[lo:hi] as this dtype holds it, in float64."""
        return (self.x[lo:hi].double() * (1 + r) + r / 4).to(self.dtype).double()

    def fill_input(self) -> None:
        if self.op == "allgather":
            lo = self.rank * self.shard
            self.inp.copy_(self.values(self.rank, lo, lo + self.shard))
        else:
            self.inp.copy_(self.values(self.rank, 0, self.count))

    def run(self, group) -> None:
        if self.op == "allreduce":
            dist.all_reduce(self.inp, group=group)
        elif self.op == "allreduce_int8":
            from lightning_mccl import int8

            int8.all_reduce(self.inp, None, "sum", group).wait()
        elif self.op == "broadcast":
            dist.broadcast(self.inp, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        elif self.op == "reduce":
            dist.reduce(self.inp, dst=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        elif self.op == "allgather":
            dist.all_gather_into_tensor(self.out, self.inp, group=group)
        elif self.op == "reduce_scatter":
            dist.reduce_scatter_tensor(self.out, self.inp, group=group)
        elif self.op == "alltoall":
            dist.all_to_all_single(self.out, self.inp, group=group)
        else:
            raise ValueError(f"unknown op {self.op!r}")

    def expected(self, lo: int, hi: int) -> torch.Tensor:
        """Elements lo:hi of this rank's expected output, float64."""
        n, r = self.world, self.rank
        if self.op in ("allreduce", "allreduce_int8") or (self.op == "reduce" and r == 0):
            return sum(self.values(q, lo, hi) for q in range(n))
        if self.op == "reduce":  # not the root: not checked (check() skips it)
            return self.out[lo:hi].double()
        if self.op == "broadcast":
            return self.values(0, lo, hi)
        if self.op == "allgather":  # output element j comes from rank j // shard
            return torch.cat([self.values(q, a, b) for q, a, b in _split(lo, hi, self.shard)])
        if self.op == "reduce_scatter":
            base = r * self.shard
            return sum(self.values(q, base + lo, base + hi) for q in range(n))
        if self.op == "alltoall":  # output chunk q is rank q's input chunk r
            return torch.cat([self.values(q, r * self.shard + a - q * self.shard, r * self.shard + b - q * self.shard)
                              for q, a, b in _split(lo, hi, self.shard)])
        raise ValueError(f"unknown op {self.op!r}")

    def check(self) -> float:
        """Largest |result - expected| relative to the largest |expected| (0.0 for an empty buffer)."""
        worst, scale = 0.0, 0.0
        for lo in range(0, self.out.numel(), CHECK_CHUNK):
            hi = min(self.out.numel(), lo + CHECK_CHUNK)
            want = self.expected(lo, hi)
            worst = max(worst, (self.out[lo:hi].double() - want).abs().max().item())
            scale = max(scale, want.abs().max().item())
        return worst / scale if scale > 0 else worst

    def default_rtol(self) -> float:
        """Rounding of n inputs and of the result in this dtype, with room (reductions reorder sums); 8 bits
        (docs/int8.md, *The error bound*): each input and the sum encoded once, each within its block's largest
        magnitude / 252, and with MCCL_INT8_ALGO=ring each of the n-2 partial sums once more; the inputs here
        share their signs, so that no partial sum is larger than the sum, and the inputs' magnitudes together are
        the sum's: 2/252 for the exchange, n/252 for the ring, with room (n + 2)/252."""
        if self.op == "allreduce_int8":
            return (self.world + 2) / 252
        return 4 * self.world * torch.finfo(self.dtype).eps

    def prepare_timing(self) -> None:
        """Timed runs reuse the buffers; an in-place allreduce or reduce would grow the values, so they run on
        zeros."""
        if self.op in ("allreduce", "allreduce_int8", "reduce"):
            self.inp.zero_()
        else:
            self.fill_input()

    @property
    def size_bytes(self) -> int:
        esize = self.inp.element_size()
        return (self.out.numel() if self.op == "allgather" else self.inp.numel()) * esize


def _split(lo: int, hi: int, shard: int):
    """[lo, hi) cut at multiples of `shard`: (owner q, lo, hi) pieces."""
    while lo < hi:
        q = lo // shard
        end = min(hi, (q + 1) * shard)
        yield q, lo, end
        lo = end
