"""Collectives whose results every rank can check exactly, for the fault, garbage and soak harnesses.

`run_op(name, n, rank, world, k)` runs one collective on float32 buffers filled with small integers that
depend only on (rank, k), so every sum is exact in float32 and every rank knows the expected result
without talking to anyone; it returns None when the result is right and a description when it is not.
`n` is the element count of the largest buffer of the call (allgather's output, reduce_scatter's input).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# torch 2.14 renamed all_gather_into_tensor / reduce_scatter_tensor (and warns about the old names).
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter", "reduce", "alltoall", "barrier", "sendrecv")


def value(rank: int, k: int) -> float:
    """Rank's fill value in round k: small integers, so any sum over <= 64 ranks is exact in float32."""
    return float(rank + 1 + (k % 5))


def per_rank(n: int, world: int) -> int:
    """The per-rank piece of an `n`-element buffer (at least 1 element)."""
    return max(1, n // world)


def _check(t: torch.Tensor, expected: torch.Tensor, what: str):
    if torch.equal(t, expected):
        return None
    bad = (t != expected).nonzero()
    i = int(bad[0]) if bad.numel() else -1
    return (f"{what}: {int(bad.numel())}/{t.numel()} elements wrong; first at [{i}]: got {t.reshape(-1)[i].item()}, "
            f"expected {expected.reshape(-1)[i].item()}")


def run_op(name: str, n: int, rank: int, world: int, k: int, group=None):
    """Runs collective `name` once (round k). Raises what the backend raises; returns None or what is wrong."""
    v = value(rank, k)
    if name == "allreduce":
        t = torch.full((n,), v)
        dist.all_reduce(t, group=group)
        return _check(t, torch.full((n,), sum(value(r, k) for r in range(world))), "allreduce")
    if name == "allgather":
        m = per_rank(n, world)
        out = torch.empty(m * world)
        all_gather_single(out, torch.full((m,), v), group=group)
        exp = torch.cat([torch.full((m,), value(r, k)) for r in range(world)])
        return _check(out, exp, "allgather")
    if name == "broadcast":
        root = k % world
        t = torch.full((n,), v if rank == root else -1.0)
        dist.broadcast(t, src=root, group=group)
        return _check(t, torch.full((n,), value(root, k)), "broadcast")
    if name == "reduce_scatter":
        m = per_rank(n, world)
        out = torch.empty(m)
        reduce_scatter_single(out, torch.full((m * world,), v), group=group)
        return _check(out, torch.full((m,), sum(value(r, k) for r in range(world))), "reduce_scatter")
    if name == "reduce":
        root = k % world
        t = torch.full((n,), v)
        dist.reduce(t, dst=root, group=group)
        if rank != root:
            return None
        return _check(t, torch.full((n,), sum(value(r, k) for r in range(world))), "reduce")
    if name == "alltoall":
        m = per_rank(n, world)
        out = torch.empty(m * world)
        # block j of this rank's input goes to rank j; it holds value(rank, k) + j
        inp = torch.cat([torch.full((m,), v + j) for j in range(world)])
        dist.all_to_all_single(out, inp, group=group)
        exp = torch.cat([torch.full((m,), value(r, k) + rank) for r in range(world)])
        return _check(out, exp, "alltoall")
    if name == "barrier":
        dist.barrier(group=group)
        return None
    if name == "sendrecv":  # a ring exchange: send to the right, receive from the left
        if world == 1:
            return None
        right, left = (rank + 1) % world, (rank - 1) % world
        out = torch.empty(n)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((n,), v), right, group=group),
                                       dist.P2POp(dist.irecv, out, left, group=group)])
        for r in reqs:
            r.wait()
        return _check(out, torch.full((n,), value(left, k)), "sendrecv")
    raise ValueError(f"unknown collective {name!r}; known: {', '.join(OPS)}")
