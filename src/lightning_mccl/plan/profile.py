"""A compute profile: what one training step of a model costs on one device, as `mccl plan` measures it
(measure.py) and reads it back (`--profile FILE`), so that a profile made on one Mac plans a fleet.

Every time is a median over the timed steps, measured from the step's start (before zero_grad): the forward
pass's end, each parameter's gradient accumulated (in the order backward produced them: DDP builds its
buckets in that order), the backward pass's end, and the step's end after the optimizer step and a device
synchronize (the stand-in's "compute" series: benchmarks/fleet_ddp.py). When several processes shared the
device while it was measured (`--share-device N`, the stand-in's ranks on one GPU), each time is the latest
over them, as the slowest rank decides when a collective can start. `kernels` holds the methods' own work on
the device (kernels.py). The file is JSON with a header naming its format and version.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, Optional, Tuple

from ..wire_policy import POWERSGD

FORMAT = "lightning-mccl compute profile"
VERSION = 1


class ProfileError(ValueError):
    """A profile file that cannot be used: names the file and the cause."""


@dataclass(frozen=True)
class Param:
    name: str
    shape: Tuple[int, ...]
    value_bytes: int  # bytes per value of its gradient (4 for float32)
    ready_s: float  # step start to its gradient accumulated

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.value_bytes


@dataclass(frozen=True)
class PowerSGDCost:
    """PowerSGD's matrix work for every compressible matrix of the model at one rank, same-shaped matrices
    batched (as `compress="powersgd"` runs it), seconds: `p_s` error feedback and P = M Q (in the hook),
    `q_s` orthogonalising P and Q = M^T P (between P's and Q's allreduces), `d_s` M = P Q^T and the new
    error (after Q's allreduce)."""
    p_s: float
    q_s: float
    d_s: float


@dataclass(frozen=True)
class Kernels:
    """The methods' work on the device, seconds per byte of float32 gradient: the bf16 hook's cast (and
    division) before its allreduce and the copy back after; DiLoCo's pseudo-gradient (anchor - weights) and
    its outer Nesterov step (anchor and weights updated). `powersgd`: by rank. (int8 quantises in the
    engine, on the CPU, as it sends: docs/int8.md.)"""
    bf16_encode: float = 0.0
    bf16_decode: float = 0.0
    pseudo_gradient: float = 0.0
    outer_step: float = 0.0
    powersgd: Dict[int, PowerSGDCost] = field(default_factory=dict)


@dataclass(frozen=True)
class Profile:
    model: str  # a timm name or module:Class
    model_args: Dict[str, object]  # img_size, patch_size, depth, num_classes, init_args: how it was built
    batch: int  # samples per step
    device: str  # cpu, cuda, mps
    device_name: str
    share_device: int  # processes that shared the device while it was measured (1: alone)
    steps: int  # timed steps (after `warmup` untimed ones)
    warmup: int
    optimizer: str
    forward_s: float
    backward_s: float  # step start to the backward pass's end
    step_s: float  # the whole compute step: no communication
    params: Tuple[Param, ...]  # in the order backward produced their gradients
    kernels: Kernels
    machine: Dict[str, str] = field(default_factory=dict)  # host, torch version, date
    compute_scale: float = 1.0  # every time above multiplied by this at plan time (an assumption when != 1)

    @property
    def optimizer_s(self) -> float:
        """Backward's end to the step's end: the optimizer step and the synchronize."""
        return max(0.0, self.step_s - self.backward_s)

    @property
    def grad_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    def scaled(self, factor: float) -> "Profile":
        """The profile with every device time multiplied by `factor` (a faster device: < 1)."""
        if not factor > 0:
            raise ValueError(f"compute scale must be positive, got {factor}")
        k = self.kernels
        kernels = Kernels(**{f: getattr(k, f) * factor for f in _KERNEL_FIELDS},
                          powersgd={r: PowerSGDCost(c.p_s * factor, c.q_s * factor, c.d_s * factor)
                                    for r, c in k.powersgd.items()})
        return replace(self, forward_s=self.forward_s * factor, backward_s=self.backward_s * factor,
                       step_s=self.step_s * factor, kernels=kernels, compute_scale=self.compute_scale * factor,
                       params=tuple(replace(p, ready_s=p.ready_s * factor) for p in self.params))

    def to_json(self) -> dict:
        d = asdict(self)
        d["params"] = [[p.name, list(p.shape), p.value_bytes, p.ready_s] for p in self.params]
        d["kernels"][POWERSGD] = {str(r): asdict(c) for r, c in self.kernels.powersgd.items()}
        return {"format": FORMAT, "version": VERSION, **d}

    @classmethod
    def from_json(cls, d: dict, where: str = "profile") -> "Profile":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ProfileError(f"{where}: not a {FORMAT} (make one with mccl plan --save-profile FILE)")
        if d.get("version") != VERSION:
            raise ProfileError(f"{where}: version {d.get('version')!r}, this lightning-mccl reads version {VERSION}")
        try:
            k = d["kernels"]
            kernels = Kernels(**{f: float(k[f]) for f in _KERNEL_FIELDS},
                              powersgd={int(r): PowerSGDCost(**c) for r, c in k[POWERSGD].items()})
            params = tuple(Param(str(n), tuple(int(x) for x in s), int(b), float(t)) for n, s, b, t in d["params"])
            profile = cls(model=str(d["model"]), model_args=dict(d["model_args"]), batch=int(d["batch"]),
                          device=str(d["device"]), device_name=str(d["device_name"]),
                          share_device=int(d["share_device"]), steps=int(d["steps"]), warmup=int(d["warmup"]),
                          optimizer=str(d["optimizer"]), forward_s=float(d["forward_s"]),
                          backward_s=float(d["backward_s"]), step_s=float(d["step_s"]), params=params,
                          kernels=kernels, machine=dict(d.get("machine", {})),
                          compute_scale=float(d.get("compute_scale", 1.0)))
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"{where}: a field is missing or malformed ({type(e).__name__}: {e})") from None
        problem = profile.problem()
        if problem:
            raise ProfileError(f"{where}: {problem}")
        return profile

    def problem(self) -> Optional[str]:
        """Why these numbers cannot describe a step (None when they can)."""
        if not self.params:
            return "no parameters with gradients"
        if self.batch < 1:
            return f"batch {self.batch}"
        if not 0 <= self.forward_s <= self.backward_s <= self.step_s:
            return (f"times out of order: forward {self.forward_s}, backward {self.backward_s}, "
                    f"step {self.step_s} s")
        late = [p.name for p in self.params if not 0 <= p.ready_s <= self.backward_s]
        if late:
            return f"gradients ready outside the backward pass: {', '.join(late[:3])}"
        return None


_KERNEL_FIELDS = ("bf16_encode", "bf16_decode", "pseudo_gradient", "outer_step")


def save(profile: Profile, path: str) -> None:
    with open(path, "w") as f:
        json.dump(profile.to_json(), f, indent=1)
        f.write("\n")


def load(path: str) -> Profile:
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ProfileError(f"profile {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ProfileError(f"profile {path}: not JSON ({e})") from None
    return Profile.from_json(data, f"profile {path}")
