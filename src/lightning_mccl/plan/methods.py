"""The ways to train on a fleet that `mccl plan` predicts, each as the bytes it sends and the work it adds.

    ddp        DDP's float32 allreduce per bucket (MCCLStrategy's default: 5 MB buckets over mccl)
    bf16       torch's bf16_compress_hook (`compress="bf16"` on an accelerator): each bucket cast to bfloat16
               on the device, half the bytes, cast back after
    int8       the engine's 8-bit allreduce with error feedback (`compress="int8"`, docs/int8.md): each bucket
               from a comm hook, as int8 codes with a float32 scale per 256 values (a quarter of the bytes and
               1/64 more), by the reduce-once exchange, at the share of the link it was measured to carry
               (link.exchange_efficiency) unless its codec is given slower
    powersgd   torch's powerSGD_hook at rank r (`compress="powersgd"`: one bucket, same-shaped matrices
               batched): per bucket a chain of three allreduces, the tensors it does not compress (float32),
               then the P matrices (sum of n x r), then, after orthogonalising P and computing Q on the
               device, the Q matrices (sum of m x r), then P Q^T and the new error on the device
    diloco     H inner steps with no communication, then the pseudo-gradient (anchor - weights) allreduced in
               float32, bf16 on the wire or 8 bits, while the next tau steps run, then the outer step
               (`MCCLDiLoCoStrategy(sync_every=H, sync_delay=tau, fragments=F, compress=...)`, docs/diloco.md):
               in one piece at the round's end, or in F fragments on the round's staggered steps

The device work comes from the profile's kernels (measured on the device, profile.py); the collectives' cost
from the link (link.py); the bucketed methods run through DDP's schedule (schedule.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from .. import wire_policy
from ..diloco.schedule import fragment_bounds, offsets
from ..diloco.settings import FRAGMENTS, check_fragments, resolve_fragments
from ..wire_policy import ROWS
from .buckets import MIB, Bucket, buckets
from .link import BF16_WIRE_EFFICIENCY, Link
from .profile import Param, Profile
from .schedule import Chain, Collective, bucketed_step

BF16_BYTES = 2
INT8_BLOCK = 256  # values per scale (csrc/engine/int8_blocks.h)
INT8_SCALE_BYTES = 4  # one float32 scale per block
POWERSGD_MIN_COMPRESSION_RATE = 2  # PowerSGDState's default: a matrix is compressed if that saves 2x or more


@dataclass(frozen=True)
class Timing:
    step_s: float  # the average training step
    comm_s: float  # the collectives' time in it (overlapped or not)


class Bucketed:
    """A method that sends every step's gradients in DDP's buckets."""
    name = ""

    def __init__(self, bucket_mb: float, first_bucket_mb: Optional[float] = None):
        self.cap_bytes = int(bucket_mb * MIB)
        self.first_cap_bytes = int((first_bucket_mb or bucket_mb) * MIB)

    def buckets(self, profile: Profile) -> List[Bucket]:
        return buckets(profile.params, self.cap_bytes, self.first_cap_bytes)

    def chain(self, bucket: Bucket, profile: Profile) -> Chain:
        raise NotImplementedError

    def timing(self, profile: Profile, n: int, link: Link) -> Timing:
        if n < 2:
            return Timing(profile.step_s, 0.0)
        chains = [self.chain(b, profile) for b in self.buckets(profile)]
        t = bucketed_step(chains, profile.backward_s, profile.optimizer_s, n, link)
        return Timing(t.step_s, t.comm_s)


class DDP(Bucketed):
    name = ROWS[None].plan

    def chain(self, bucket: Bucket, profile: Profile) -> Chain:
        return Chain(bucket.ready_s, (Collective(bucket.nbytes),))


class BF16(Bucketed):
    name = ROWS[wire_policy.BF16].plan

    def chain(self, bucket: Bucket, profile: Profile) -> Chain:
        k = profile.kernels
        return Chain(bucket.ready_s, (Collective(bucket.numel * BF16_BYTES),), issued_s=bucket.nbytes * k.bf16_encode,
                     after_s=bucket.nbytes * k.bf16_decode, hook=True)


def int8_bytes(numel: int, block: int = INT8_BLOCK) -> int:
    """int8 values and one float32 scale per block of `block` values."""
    return numel + math.ceil(numel / block) * INT8_SCALE_BYTES


class Int8(Bucketed):
    name = ROWS[wire_policy.INT8].plan

    def __init__(self, bucket_mb: float, first_bucket_mb: Optional[float] = None, codec_Bps: Optional[float] = None):
        super().__init__(bucket_mb, first_bucket_mb)
        self.codec_Bps = codec_Bps

    def chain(self, bucket: Bucket, profile: Profile) -> Chain:
        return Chain(bucket.ready_s, (Collective(int8_bytes(bucket.numel), rate_Bps=self.codec_Bps, exchange=True),),
                     hook=True)


def powersgd_matrix(p: Param, rank: int):
    """(rows, cols, rank used) when PowerSGD compresses this gradient, else None: a tensor of 2 or more
    dimensions viewed as shape[0] x the rest, compressed when (rows + cols) x rank x 2 < rows x cols."""
    if len(p.shape) < 2:
        return None
    rows = p.shape[0]
    cols = p.numel // rows
    r = min(rows, cols, rank)
    return (rows, cols, r) if (rows + cols) * r * POWERSGD_MIN_COMPRESSION_RATE < rows * cols else None


class PowerSGD(Bucketed):
    name = ROWS[wire_policy.POWERSGD].plan

    def __init__(self, rank: int, bucket_mb: float, first_bucket_mb: Optional[float] = None):
        super().__init__(bucket_mb, first_bucket_mb)
        self.rank = rank

    def chain(self, bucket: Bucket, profile: Profile) -> Chain:
        cost = profile.kernels.powersgd.get(self.rank)
        if cost is None:
            raise ValueError(f"the profile has PowerSGD's matrix work at ranks {sorted(profile.kernels.powersgd)}, "
                             f"not at rank {self.rank}: profile again with --powersgd-ranks {self.rank}")
        mats = {p.name: powersgd_matrix(p, self.rank) for p in profile.params}
        total = sum(r * c for r, c, _ in filter(None, mats.values())) or 1
        mine = [mats[p.name] for p in bucket.params if mats[p.name]]
        share = sum(r * c for r, c, _ in mine) / total
        value_bytes = bucket.params[0].value_bytes
        plain = sum(p.nbytes for p in bucket.params if not mats[p.name])
        ps = sum(r * k for r, _, k in mine) * value_bytes
        qs = sum(c * k for _, c, k in mine) * value_bytes
        return Chain(bucket.ready_s, (Collective(plain), Collective(ps), Collective(qs, before_s=cost.q_s * share)),
                     issued_s=cost.p_s * share, after_s=cost.d_s * share, hook=True)


DILOCO = "diloco"  # the plan's name for DiLoCo (MCCLDiLoCoStrategy)
# how DiLoCo's pseudo-gradient may travel: the wire policy's DiLoCo rows (fp16 costs what bf16 does)
DILOCO_WIRES = tuple(ROWS[c].name for c in (None, *wire_policy.DILOCO_CHOICES) if c != wire_policy.FP16)


class DiLoCo:
    """DiLoCo's rounds as the strategy schedules them (lightning_mccl.diloco.schedule): H inner steps, each the
    compute step; the parameters in F fragments of about equal size (one with F = 1; "auto": min(H, the
    profile's parameter tensors), as the strategy resolves it, `parts`), fragment f's
    pseudo-gradient computed on the device after step ceil((f + 1) H / F) of the round and its allreduce
    started, its outer step applied tau steps later, first waiting for whatever of that allreduce the tau steps
    did not hide. The allreduces share the link one after another. The step is a round's average, in the steady
    state (`_round_s`). The wire: float32, bf16 (the engine narrows on the wire, at BF16_WIRE_EFFICIENCY of the
    link) or int8 (the 8-bit exchange)."""
    name = DILOCO

    def __init__(self, sync_every: int, sync_delay: int = 1, wire: str = wire_policy.BF16,
                 codec_Bps: Optional[float] = None, fragments: Union[int, str] = FRAGMENTS):
        if sync_every < 1:
            raise ValueError(f"sync_every must be at least 1, got {sync_every}")
        if not 1 <= sync_delay <= sync_every:
            raise ValueError(f"sync_delay must be between 1 and sync_every ({sync_every}), got {sync_delay}")
        if wire not in DILOCO_WIRES:
            raise ValueError(f"DiLoCo's pseudo-gradient travels as {', '.join(DILOCO_WIRES)}, not {wire!r}")
        check_fragments(fragments, "DiLoCo")
        self.sync_every, self.sync_delay, self.wire, self.codec_Bps = sync_every, sync_delay, wire, codec_Bps
        self.fragments = fragments

    def allreduce_s(self, numel: int, nbytes: int, n: int, link: Link) -> float:
        """One sync of a pseudo-gradient of `numel` values (`nbytes` as the gradients) on `n` hosts, on this
        method's wire."""
        if self.wire == wire_policy.INT8:
            return link.allreduce_s(int8_bytes(numel), n, rate_Bps=self.codec_Bps, exchange=True)
        if self.wire == wire_policy.BF16:
            return link.allreduce_s(numel * BF16_BYTES, n, rate_Bps=BF16_WIRE_EFFICIENCY * link.goodput_Bps)
        return link.allreduce_s(nbytes, n)

    def parts(self, profile: Profile) -> int:
        """The number of fragments on `profile`'s model: "auto" resolved as the strategy resolves it."""
        return resolve_fragments(self.fragments, self.sync_every, len(profile.params))

    def timing(self, profile: Profile, n: int, link: Link) -> Timing:
        if n < 2:
            return Timing(profile.step_s, 0.0)
        params = profile.params[::-1]  # the model's order (the profile's is backward's)
        fragments = self.parts(profile)
        if fragments > len(params):
            raise ValueError(f"fragments={fragments} is more than the model's {len(params)} parameter tensors")
        bounds = fragment_bounds([p.numel for p in params], fragments)
        parts = [params[a:b] for a, b in zip(bounds, bounds[1:])]
        k = profile.kernels
        syncs = []
        for part in parts:
            numel, nbytes = sum(p.numel for p in part), sum(p.nbytes for p in part)
            syncs.append((self.allreduce_s(numel, nbytes, n, link), nbytes * k.pseudo_gradient, nbytes * k.outer_step))
        round_s = _round_s(profile.step_s, self.sync_every, self.sync_delay, syncs)
        return Timing(round_s / self.sync_every, sum(a for a, _, _ in syncs) / self.sync_every)


WALK_ROUNDS = 64  # DiLoCo's rounds walked by _round_s: the mean of the last 32 is within 1% of 800 rounds' (tests)


def _round_s(step_s: float, h: int, tau: int, syncs: List[Tuple[float, float, float]]) -> float:
    """A round's time in the steady state, by walking the schedule: `syncs` is each fragment's (allreduce,
    pseudo-gradient, outer step) seconds. Each inner step runs its compute, then the outer steps due (each after
    its allreduce is done), then the syncs that start (the pseudo-gradient on the device, the allreduce queued
    on the link behind the ones still sending). A link slower than the steps builds a queue over several rounds
    before the waits pace it, and the waits can settle into a pattern longer than a round: the walk runs
    WALK_ROUNDS rounds and returns the mean of the second half's."""
    starts: Dict[int, List[int]] = {}
    for f, step in enumerate(offsets(h, len(syncs))):
        starts.setdefault(step, []).append(f)
    clock = link_free = 0.0
    done: Dict[int, Tuple[int, float]] = {}  # fragment -> (the step its outer step applies after, allreduce done)
    half = WALK_ROUNDS // 2
    for r in range(WALK_ROUNDS):
        if r == half:
            began = clock
        for step in range(1, h + 1):
            t = r * h + step
            clock += step_s
            for f, (due, ready) in sorted(done.items()):
                if due == t:
                    clock = max(clock, ready) + syncs[f][2]
                    del done[f]
            for f in starts.get(step, ()):
                allreduce, pseudo_gradient, _ = syncs[f]
                clock += pseudo_gradient
                link_free = max(link_free, clock) + allreduce
                done[f] = (t + tau, link_free)
    return (clock - began) / (WALK_ROUNDS - half)


METHODS = (DDP.name, BF16.name, Int8.name, PowerSGD.name, DILOCO)
