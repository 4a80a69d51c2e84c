"""The plan: every method's training step on each fleet size, from a profile and a link.

    step        the predicted training step (DiLoCo: a round's average)
    samples/s   hosts x batch / step
    efficiency  one Mac's compute step / step (benchmarks/fleet_ddp.py's definition)
    speed-up    samples/s over one Mac's (hosts x efficiency)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Sequence, Union

from ..diloco.settings import FRAGMENTS, SYNC_DELAY, SYNC_EVERY
from ..wire_policy import BF16 as BF16_WIRE, INT8, POWERSGD, ROWS
from .link import Link
from .methods import BF16, DDP, DILOCO, DiLoCo, Int8, METHODS, PowerSGD
from .profile import Profile

# The strategies' defaults, read from where they are declared (both torch-free): the wire policy's rows and
# DiLoCo's settings; give the H you train with.
BUCKET_MB = ROWS[None].bucket_mb
POWERSGD_BUCKET_MB = ROWS[POWERSGD].bucket_mb
INT8_BUCKET_MB = ROWS[INT8].bucket_mb
POWERSGD_RANK = ROWS[POWERSGD].options["matrix_approximation_rank"]


@dataclass(frozen=True)
class Settings:
    """How each method runs (the strategy's defaults unless said)."""
    bucket_mb: float = BUCKET_MB
    first_bucket_mb: Optional[float] = None  # None: bucket_mb (DDP's own default: 1 MiB first, 25 after)
    powersgd_rank: int = POWERSGD_RANK
    powersgd_bucket_mb: float = POWERSGD_BUCKET_MB
    int8_bucket_mb: float = INT8_BUCKET_MB
    sync_every: int = SYNC_EVERY
    sync_delay: int = SYNC_DELAY
    fragments: Union[int, str] = FRAGMENTS  # "auto": min(sync_every, the model's parameter tensors)
    diloco_wire: str = BF16_WIRE  # DiLoCo's compress: float32, bf16, int8
    int8_codec_Bps: Optional[float] = None  # the engine's int8 codec rate, wire bytes/s (None: the link's)


def on_model(s: Settings, profile: Profile) -> Settings:
    """`s` on `profile`'s model: DiLoCo's fragments as a number ("auto" resolved, methods.DiLoCo.parts), for
    what names them beside the timings (the accuracy rows, the assumptions)."""
    return replace(s, fragments=DiLoCo(s.sync_every, fragments=s.fragments).parts(profile))


def build_methods(names: Sequence[str], s: Settings) -> list:
    """The methods named (METHODS), in that order, set up as `s` says; ValueError naming an unknown one."""
    make = {DDP.name: lambda: DDP(s.bucket_mb, s.first_bucket_mb),
            BF16.name: lambda: BF16(s.bucket_mb, s.first_bucket_mb),
            Int8.name: lambda: Int8(s.int8_bucket_mb, s.first_bucket_mb, codec_Bps=s.int8_codec_Bps),
            PowerSGD.name: lambda: PowerSGD(s.powersgd_rank, s.powersgd_bucket_mb, s.first_bucket_mb),
            DILOCO: lambda: DiLoCo(s.sync_every, s.sync_delay, s.diloco_wire, s.int8_codec_Bps, s.fragments)}
    unknown = [n for n in names if n not in make]
    if unknown:
        raise ValueError(f"unknown method {', '.join(map(repr, unknown))} (use {', '.join(METHODS)})")
    return [make[n]() for n in names]


@dataclass(frozen=True)
class Prediction:
    hosts: int
    method: str
    step_s: float
    samples_per_s: float
    efficiency: float
    speedup: float
    comm_s: float  # the collectives' time per step, overlapped or not
    exposed_s: float  # step - one Mac's compute step


def predict(profile: Profile, link: Link, methods: Sequence, hosts: Sequence[int]) -> List[Prediction]:
    one = profile.step_s
    out = []
    for m in methods:
        for n in hosts:
            t = m.timing(profile, n, link)
            out.append(Prediction(n, m.name, t.step_s, n * profile.batch / t.step_s, one / t.step_s,
                                  n * one / t.step_s, t.comm_s, t.step_s - one))
    return out
