"""DDP's bucket schedule, overlapping the backward pass: when a training step on n hosts ends.

Each bucket becomes a chain: device work issued with it (a comm hook's cast or quantisation, in the device's
stream right after the bucket's last gradient, so it delays the rest of the backward pass too), then one or
more collectives (the plain allreduce; PowerSGD's three), each perhaps after device work of its own, then
device work that puts the result back (a cast back, a dequantisation). The schedule:

    the backward pass      ends at backward_s plus every bucket's issued work (the stream runs it in line)
    a chain's first        starts when its bucket is ready (plus the issued work before it) and the engine
      collective             has finished the previous collective: the engine runs one collective at a time,
                             in the order they were issued (docs/completion-order.md)
    a collective after     waits for that work, queued on the device behind the backward pass (the CPU runs
      device work            ahead of the device and has queued all of it)
    the step               ends when the device has finished the backward pass and every chain's work and
                             the engine its last collective, plus the optimizer step

With one host there is nothing to send: the step is the profile's compute step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from .link import Link


@dataclass(frozen=True)
class Collective:
    nbytes: float  # as they travel
    before_s: float = 0.0  # device work queued before it (computing its input)
    rate_Bps: Optional[float] = None  # a codec that moves the bytes slower than the link
    exchange: bool = False  # the 8-bit reduce-once exchange instead of the engine's allreduce (link.py)


@dataclass(frozen=True)
class Chain:
    ready_s: float  # the bucket can be launched (from the step's start)
    collectives: Tuple[Collective, ...]
    issued_s: float = 0.0  # device work issued with the bucket, in line with the backward pass
    after_s: float = 0.0  # device work queued after its last collective
    hook: bool = False  # issued from a Python comm hook (pays the hook's latency per collective)


@dataclass(frozen=True)
class StepTime:
    step_s: float
    comm_s: float  # the collectives' time, summed (overlapped or not)
    backward_end_s: float  # the device's backward pass with the issued work
    last_done_s: float  # the engine's last collective done


def bucketed_step(chains: Sequence[Chain], backward_s: float, optimizer_s: float, n: int, link: Link) -> StepTime:
    """The step of n hosts that allreduce `chains` (in launch order) while a backward pass of `backward_s`
    runs, then take an optimizer step of `optimizer_s`."""
    issued = 0.0
    device_free = backward_s + sum(c.issued_s for c in chains)
    engine_free, comm = 0.0, 0.0
    for chain in chains:
        issued += chain.issued_s
        t = chain.ready_s + issued
        for c in chain.collectives:
            if c.before_s:
                t = max(t, device_free) + c.before_s
                device_free = t
            cost = link.allreduce_s(c.nbytes, n, chain.hook, c.rate_Bps, c.exchange)
            t = max(t, engine_free) + cost
            engine_free, comm = t, comm + cost
        if chain.after_s:
            device_free = max(t, device_free) + chain.after_s
    return StepTime(max(device_free, engine_free) + optimizer_s, comm, backward_s + issued, engine_free)
