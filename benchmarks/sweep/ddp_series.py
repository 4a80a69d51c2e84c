"""What the DDP benchmark (fleet_ddp.py) compares: a series is a backend, an optional wire compression of the
engine, an optional DDP comm hook and DDP's own settings.

    compute                      the same training step without DDP (no communication at all)
    mccl  gloo                   DDP on that backend
    mccl-bf16  mccl-fp16         mccl with MCCL_WIRE_DTYPE=bf16 / fp16 (the engine narrows float32 on the wire)
    mccl+bf16_hook               DDP comm hook: bf16_hook, fp16_hook (torch's compress hooks), powersgd,
                                 powersgd_batched (PowerSGDState(batch_tensors_with_same_shape=True)), int8
                                 (mccl only: the engine's 8-bit allreduce with error feedback, lightning_mccl.int8)
    mccl:bucket=100:view:static  DDP settings: bucket_cap_mb, gradient_as_bucket_view, static_graph
    mccl:MCCL_NSOCKS=2           upper-case KEY=VALUE: an environment variable of the ranks (mccl series)
    mccl+diloco:H=32:delay=1     DiLoCo (lightning_mccl.diloco) instead of DDP: the model unwrapped, an outer
                                 allreduce every H steps applied `delay` steps later (default 1);
                                 mccl-bf16+diloco:H=32 sends the pseudo-gradients in bf16; frag=F syncs the
                                 model in F fragments on staggered steps (DiLoCo's `fragments`; default 1, the
                                 whole model, as the record's series ran, not the strategy's "auto")
    ...:label=NAME               the label in the table (default: the text itself)

A process group reads MCCL_WIRE_DTYPE and the other MCCL_* variables when it is made, and a launch makes one, so
each set of variables is a launch of its own (with its own compute series, so that every efficiency compares
steps of the same processes); Gloo joins the launch without any. PowerSGD also gets a launch of its own: a
failure there (its chained collectives, issue 10) loses that series only. So does each DiLoCo series, whose
steps run one after another rather than in turns with the other series' (its outer allreduce must overlap its
own next steps, not another series' step), with the launch's compute series before it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

BACKENDS = ("mccl", "gloo")
WIRE = {"bf16": "bf16", "fp16": "fp16"}
HOOKS = ("bf16_hook", "fp16_hook", "powersgd", "powersgd_batched", "int8")
DILOCO = "diloco"
COMPUTE = "compute"
_ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")


@dataclass(frozen=True)
class DDPSeries:
    label: str
    backend: str  # "none" for compute
    wire: str = ""  # MCCL_WIRE_DTYPE, "" = off
    hook: str = ""
    ddp: Dict[str, object] = field(default_factory=dict)  # DistributedDataParallel keyword arguments
    extra_env: Tuple[Tuple[str, str], ...] = ()  # the ranks' other variables (KEY=VALUE options), sorted
    sync_every: int = 0  # DiLoCo's H (0: DDP)
    sync_delay: int = 1  # DiLoCo's delay
    fragments: int = 1  # DiLoCo's fragments

    @property
    def powersgd(self) -> bool:
        return self.hook.startswith("powersgd")

    @property
    def diloco(self) -> bool:
        return self.sync_every > 0

    @property
    def alone(self) -> bool:
        """In a launch of its own (with the compute series)."""
        return self.powersgd or self.diloco

    @property
    def compressed(self) -> bool:
        return bool(self.wire) or self.hook in ("bf16_hook", "fp16_hook", "int8")

    @property
    def env(self) -> Dict[str, str]:
        return {**dict(self.extra_env), **({"MCCL_WIRE_DTYPE": self.wire} if self.wire else {})}

    def whole_rounds(self, warmup: int, steps: int) -> range:
        """A DiLoCo series' timed steps (0-based, in the timed window) that make whole rounds, each after a round
        that started a sync (so that they hold as many applies as starts); empty when there are none."""
        every = self.sync_every
        first = max(-(-warmup // every) * every, every)  # a round's first step, after at least one round
        rounds = max((warmup + steps - first) // every, 0)
        return range(first - warmup, first - warmup + rounds * every)

    def to_json(self) -> dict:
        return {"label": self.label, "backend": self.backend, "wire": self.wire, "hook": self.hook,
                "ddp": dict(self.ddp), "env": dict(self.extra_env), "sync_every": self.sync_every,
                "sync_delay": self.sync_delay, "fragments": self.fragments}

    @classmethod
    def from_json(cls, d: dict) -> "DDPSeries":
        return cls(d["label"], d["backend"], d["wire"], d["hook"], dict(d["ddp"]), tuple(sorted(d["env"].items())),
                   d["sync_every"], d["sync_delay"], d["fragments"])


def parse(text: str) -> List[DDPSeries]:
    """Comma-separated items as in the module docstring; ValueError naming the bad item."""
    out: List[DDPSeries] = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        name, *opts = item.split(":")
        label, ddp, env, outer = item, {}, {}, {}
        for opt in opts:
            key, sep, value = opt.partition("=")
            try:
                if key == "label" and sep:
                    label = value
                elif key in ("H", "delay", "frag") and sep and name.endswith("+" + DILOCO):
                    outer[key] = int(value)
                elif _ENV_KEY.match(key) and sep and key != "MCCL_WIRE_DTYPE":
                    env[key] = value
                elif key == "bucket" and sep:
                    ddp["bucket_cap_mb"] = float(value)
                elif key == "view" and not sep:
                    ddp["gradient_as_bucket_view"] = True
                elif key == "static" and not sep:
                    ddp["static_graph"] = True
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(f"series {item!r}: bad option {opt!r} (label=NAME, bucket=MB, view, static, "
                                 f"KEY=VALUE, for +diloco H=STEPS, delay=STEPS and frag=F; the wire type is mccl-bf16 or "
                                 f"mccl-fp16)") from None
        if name == COMPUTE:
            if ddp or env:
                raise ValueError(f"series {item!r}: compute has no DDP settings or variables")
            out.append(DDPSeries(label, "none"))
            continue
        name, _, hook = name.partition("+")
        backend, _, wire = name.partition("-")
        if backend not in BACKENDS:
            raise ValueError(f"series {item!r}: unknown backend {backend!r} (use {', '.join(BACKENDS)})")
        if wire and (wire not in WIRE or backend != "mccl"):
            raise ValueError(f"series {item!r}: wire compression is mccl-bf16 or mccl-fp16")
        if hook and hook not in HOOKS + (DILOCO,):
            raise ValueError(f"series {item!r}: unknown hook {hook!r} (use {', '.join(HOOKS)}, or {DILOCO})")
        if hook == "int8" and backend != "mccl":
            raise ValueError(f"series {item!r}: the int8 hook is mccl's 8-bit allreduce (use mccl+int8)")
        if hook == DILOCO:
            from lightning_mccl.diloco import OUTER_LR, OUTER_MOMENTUM, check_schedule, check_settings

            if "H" not in outer or ddp:
                raise ValueError(f"series {item!r}: DiLoCo takes H=STEPS (and delay=STEPS, frag=F), no DDP "
                                 f"settings")
            owner = f"series {item!r}: DiLoCo"
            check_settings(outer["H"], OUTER_LR, OUTER_MOMENTUM, outer.get("delay", 1), owner)
            check_schedule(outer["H"], 0, outer.get("frag", 1), None, None, owner)
            out.append(DDPSeries(label, backend, WIRE.get(wire, ""), "", {}, tuple(sorted(env.items())),
                                 outer["H"], outer.get("delay", 1), outer.get("frag", 1)))
            continue
        if env and backend != "mccl":
            raise ValueError(f"series {item!r}: environment variables are for mccl series (Gloo reads no MCCL_* "
                             f"variables; --env sets one for every rank)")
        out.append(DDPSeries(label, backend, WIRE.get(wire, ""), hook, ddp, tuple(sorted(env.items()))))
    labels = [s.label for s in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"series {dup} appear twice: give them label=NAME")
    if not any(s.backend != "none" for s in out):
        raise ValueError("no DDP series given (e.g. --series compute,mccl,gloo)")
    return out


def launches(series: Sequence[DDPSeries]) -> List[List[DDPSeries]]:
    """The launches of the ranks: one per set of variables (wire type included), PowerSGD series alone; the
    compute series (when asked for) in every launch. The first launch holds the first uncompressed series, the
    weights' reference."""
    compute = [s for s in series if s.backend == "none"]
    ddp = [s for s in series if s.backend != "none"]
    keys: List[tuple] = []
    groups: Dict[tuple, List[DDPSeries]] = {}
    ref = reference(series)
    for s in sorted(ddp, key=lambda s: s is not ref):
        key = (tuple(sorted(s.env.items())), s.label if s.alone else "")
        if key not in groups:
            keys.append(key)
            groups[key] = []
        groups[key].append(s)
    return [compute + groups[k] for k in keys]


def reference(series: Sequence[DDPSeries]) -> Optional[DDPSeries]:
    """The series whose weights the others are compared with: the first exact one (no compression)."""
    return next((s for s in series if s.backend != "none" and not s.compressed and not s.alone), None)
