"""DDP's gradient buckets, as torch's Reducer builds them, and when each one is ready.

After the first iteration DDP rebuilds its buckets in the order backward produced the gradients (the
reverse of the parameters' order, roughly: the last layers first), with torch's
`compute_bucket_assignment_by_size`: parameters join the open bucket of their dtype until it holds at least
the size limit (so a bucket can exceed it by its last parameter, and a parameter larger than the limit is a
bucket of its own or nearly). The first bucket's limit is `first_cap_bytes`, every later one `cap_bytes`.
When `bucket_cap_mb` is given (MCCLStrategy gives 5 over mccl, 1000 with PowerSGD) both are that many MiB;
with DDP's default, 25 MiB and a first bucket of 1 MiB (`_DEFAULT_FIRST_BUCKET_BYTES`). So ViT-B/16 has 37
buckets at 5 MiB (its 9.4 MB MLP matrices each alone), one at 1000, 14 with DDP's default, as the fleet
stand-in's timeline counted them (torch 2.11; docs/performance.md *Where the step goes*). The buckets still
open at the end close in order.

A bucket is ready when its last gradient is, and DDP launches the buckets' allreduces in their order, so a
bucket also waits for the ones before it (`Reducer::mark_bucket_ready`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from .profile import Param

MIB = 1 << 20


@dataclass(frozen=True)
class Bucket:
    params: Tuple[Param, ...]
    ready_s: float  # the last of its gradients accumulated, from the step's start

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)


def assign(sizes: Sequence[Tuple[int, int]], cap_bytes: int, first_cap_bytes: int) -> List[List[int]]:
    """Indices into `sizes` ((bytes, dtype key) in the order the gradients become ready), grouped into DDP's
    buckets, in the order they become ready."""
    if cap_bytes < 1 or first_cap_bytes < 1:
        raise ValueError(f"bucket sizes must be positive, got {first_cap_bytes} and {cap_bytes} bytes")
    limits = (first_cap_bytes, cap_bytes)
    open_buckets: Dict[int, Tuple[List[int], int]] = {}  # dtype key -> (indices, bytes)
    limit_index: Dict[int, int] = {}
    closed: List[List[int]] = []
    for i, (nbytes, key) in enumerate(sizes):
        indices, total = open_buckets.get(key, ([], 0))
        indices.append(i)
        total += nbytes
        limit = limits[limit_index.setdefault(key, 0)]
        if total >= limit:
            closed.append(indices)
            open_buckets.pop(key, None)
            limit_index[key] = min(limit_index[key] + 1, len(limits) - 1)
        else:
            open_buckets[key] = (indices, total)
    closed += [indices for indices, _ in open_buckets.values()]
    return closed


def buckets(params: Sequence[Param], cap_bytes: int, first_cap_bytes: int) -> List[Bucket]:
    """The buckets of `params` (in the order backward produces them) in the order DDP allreduces them, each
    with the moment it can be launched."""
    out, launched = [], 0.0
    for g in assign([(p.nbytes, p.value_bytes) for p in params], cap_bytes, first_cap_bytes):
        launched = max([launched] + [params[i].ready_s for i in g])
        out.append(Bucket(tuple(params[i] for i in g), launched))
    return out
