"""What one allreduce costs on a fleet of n hosts, one rank each, on a switched link: the bytes the algorithm
puts on each host's link at the link's TCP goodput, plus the engine's fixed costs.

    ring               2(n-1) steps; each host sends 2(n-1)/n x S bytes
    recursive doubling log2(n) steps (2 more when n is not a power of two: the fold), S bytes each;
                       the engine's choice up to MCCL_RD_MAX_BYTES (docs/settings.md's table)
    exchange           the 8-bit allreduce's reduce-once exchange (docs/int8.md): each rank sends its part
                       of every segment to the segment's owner, then every owner its finished segment to
                       every rank, all at once: 2 steps, 2(n-1)/n x S bytes, at exchange_efficiency(n) of
                       the goodput
    time               op_latency + steps x step_latency + bytes / goodput

`goodput` is TCP payload bytes per second on one host's link, each way: by default the line rate's goodput
with 1500-byte frames, 1448/1514 of it (what `mccl switch`'s links carry: 9.55 Gbit/s, 1.195 GB/s, at
10gbit, docs/performance.md *The emulated switch*); `mccl doctor` measures a real fleet's (its links'
Gbit/s), to give with `mccl plan --goodput`. `op_latency` is what the engine pays per collective besides its
bytes and `step_latency` what each algorithm step adds (a hop through the switch and the peer's progress
thread); `hook_latency` is added for a collective issued from a Python comm hook. Their defaults and where
they were measured are below.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

# The engine's cost per collective besides its bytes: in the stand-in's timeline a 5 MB bucket's allreduce
# waited 0.18 ms between its issue and its start (37 collectives, 6.7 ms a step, batch 8;
# docs/performance.md *The stand-in on cubic*, `h200_cubic_8hosts/ddp8`: tl_held).
OP_LATENCY_S = 180e-6
# Added per collective issued from a Python comm hook (torch's bf16 hook, PowerSGD, int8): the bf16 hook's
# collectives waited 0.33 ms each, 0.15 ms more than plain DDP's (the same run: 12.2 against 6.7 ms a step).
HOOK_LATENCY_S = 150e-6
# Per algorithm step: a 4 KiB ring allreduce over 8 ranks took 155 us for its 14 steps on the GPU host's
# loopback (11 us a step; benchmarks/results/h200_algos_W8); a hop through a 10 GbE switch and its NICs adds a
# few us more. `mccl doctor` measures a fleet's (its latency column, one way).
STEP_LATENCY_S = 15e-6
# The engine's bf16 compression on the wire (MCCL_WIRE_DTYPE=bf16, DiLoCo's compress="bf16") carries 0.87 of
# the link's goodput on 8 hosts, its progress thread widening, adding and narrowing every piece
# (docs/performance.md, *The stand-in on cubic*: 1.74-1.88x float32's busbw).
BF16_WIRE_EFFICIENCY = 0.87
# The share of the link's goodput that the 8-bit allreduce's reduce-once exchange (every rank sending to and
# receiving from all others at once) carries in the stand-in's training step, by world size: the collectives'
# engine part against their bytes at the link. Up to 4 hosts 0.89 (124 ms for 110, `h200_plan_vs_measured`'s
# plan_fleet4, batch 8); above, 0.70 (185 ms for 129 at 8 hosts, `h200_fleet8_b8_int8dev_diloco`; 0.74 in
# plan_fleet8). 16 hosts short of cores measured 0.53 (`h200_fleet16/b8`). docs/scaling.md.
EXCHANGE_EFFICIENCY = ((4, 0.89), (None, 0.70))
# MCCL_ALGO=auto: recursive doubling up to these sizes (bytes) at up to this many ranks, the ring above
# (docs/settings.md, the algorithm table).
RD_MAX_BYTES = ((4, 64 << 10), (8, 128 << 10), (16, 256 << 10), (None, 1 << 20))


@dataclass(frozen=True)
class Link:
    goodput_Bps: float  # TCP payload bytes per second, one host's link, each way
    op_latency_s: float = OP_LATENCY_S
    step_latency_s: float = STEP_LATENCY_S
    hook_latency_s: float = HOOK_LATENCY_S

    def __post_init__(self):
        if not self.goodput_Bps > 0:
            raise ValueError(f"goodput must be positive, got {self.goodput_Bps} B/s")
        for name in ("op_latency_s", "step_latency_s", "hook_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be at least 0, got {getattr(self, name)}")

    def allreduce_s(self, nbytes: float, n: int, hook: bool = False, rate_Bps: Optional[float] = None,
                    exchange: bool = False) -> float:
        """Seconds for an allreduce of `nbytes` (as they travel) over n hosts, by the engine's choice of
        algorithm or the exchange; `rate_Bps` caps the rate the bytes move at (a codec slower than the
        link). 0 for one host: nothing to send."""
        if n < 2:
            return 0.0
        link = self.goodput_Bps * (exchange_efficiency(n) if exchange else 1.0)
        rate = min(link, rate_Bps or link)
        steps, wire = (2, ring_bytes(nbytes, n)) if exchange else algorithm_steps(nbytes, n)
        return self.op_latency_s + (self.hook_latency_s if hook else 0.0) + steps * self.step_latency_s + wire / rate


def ring_bytes(nbytes: float, n: int) -> float:
    """What the ring allreduce sends on each host's link: 2(n-1)/n x the payload."""
    return 2 * (n - 1) / n * nbytes if n > 1 else 0.0


def by_world(table, n: int):
    """The value of a ((up to this many ranks, value), ..., (None, value above)) table for n ranks."""
    return next(value for ranks, value in table if ranks is None or n <= ranks)


def rd_max_bytes(n: int) -> int:
    return by_world(RD_MAX_BYTES, n)


def exchange_efficiency(n: int) -> float:
    return by_world(EXCHANGE_EFFICIENCY, n)


def algorithm_steps(nbytes: float, n: int):
    """(steps, bytes each host sends) of the allreduce MCCL_ALGO=auto runs for this size and world."""
    if n < 2:
        return 0, 0.0
    if nbytes <= rd_max_bytes(n):
        k = int(math.floor(math.log2(n)))
        steps = k + (0 if n == 1 << k else 2)
        return steps, steps * nbytes
    return 2 * (n - 1), ring_bytes(nbytes, n)
