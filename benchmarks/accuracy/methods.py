"""The methods the convergence benchmark compares: one line each, a name and the strategy's keyword arguments that
select it (`MCCLStrategy`'s, or `MCCLDiLoCoStrategy`'s for DiLoCo), the accuracy it may lose against the
reference (its target) and the fleet_ddp.py series whose measured step time is its own.

    Method("int8", {"compress": "int8"}, 0.5, ("mccl+int8",))

Adding a method is one line in METHODS, or `--method NAME='{"compress": ...}'` on the command line
(`{"strategy": "MCCLDiLoCoStrategy", "sync_every": 8}` for a DiLoCo one). A method whose arguments its strategy
refuses (a choice not built yet) is reported as unavailable, with the error, and the others run. A DiLoCo
variant is `_diloco(NAME, H, target, series, **more MCCLDiLoCoStrategy arguments)`: a warm start, an H schedule
or fragments are one line each, named after the strategy's own arguments, and run on both tasks (from scratch,
and `--finetune`) with the same line.

With `--finetune`, CONTROLS are methods too, run after the others: `ddp-fp32-scratch` is `ddp-fp32` from random
weights on the fine-tuning task (what the same steps reach without the pretrained model). A control has no
target; it is not a way to send gradients.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

REFERENCE = "ddp-fp32"  # the method every other one is compared with: synchronous float32 DDP
DDP, DILOCO = "MCCLStrategy", "MCCLDiLoCoStrategy"


@dataclass(frozen=True)
class Method:
    name: str
    strategy: Dict[str, object]  # the strategy's keyword arguments
    max_loss_pts: Optional[float] = None  # the target: at most this many points below the reference's accuracy
    fleet_series: Tuple[str, ...] = ()  # fleet_ddp.py series labels that measured this method's step time
    cls: str = DDP  # the strategy: a class of lightning_mccl.lightning
    random_init: bool = False  # with --finetune: start from random weights, not the pretrained model

    @property
    def diloco(self) -> bool:
        return self.cls == DILOCO

    def to_json(self) -> dict:
        return {"name": self.name, "strategy": self.strategy, "class": self.cls, "random_init": self.random_init}


def _diloco(name: str, h: int, max_loss_pts: Optional[float], series: Tuple[str, ...], **options) -> Method:
    """DiLoCo as docs/diloco.md recommends it: plain averaging (the strategy's default outer step), sync_delay 1;
    `options`: more MCCLDiLoCoStrategy arguments (a variant of it)."""
    return Method(name, {"sync_every": h, **options}, max_loss_pts, series, DILOCO)


def _powersgd(rank: int) -> Dict[str, object]:
    return {"compress": "powersgd", "compress_options": {"matrix_approximation_rank": rank}}


METHODS: Tuple[Method, ...] = (
    Method(REFERENCE, {}, None, ("mccl",)),
    Method("bf16-hook", {"compress": "bf16_hook"}, None, ("mccl+bf16_hook",)),
    Method("powersgd-r1", _powersgd(1), None, ("psgd-r1",)),
    Method("powersgd-r4", _powersgd(4), None, ("psgd-r4",)),
    Method("int8", {"compress": "int8"}, 0.5, ("mccl+int8",)),
    # the whole model at the round's end (fragments=1, where the strategy's default, "auto", syncs H fragments),
    # as the record measured them
    _diloco("diloco-h2", 2, 1.0, ("mccl+diloco:H=2", "mccl+diloco:H=2:delay=1"), fragments=1),
    _diloco("diloco-h4", 4, 1.0, ("mccl+diloco:H=4", "mccl+diloco:H=4:delay=1"), fragments=1),
    _diloco("diloco-h4-warm32", 4, 1.0, ("mccl+diloco:H=4",), warm_start=32, fragments=1),
    _diloco("diloco-h4-frag4", 4, 1.0, ("mccl+diloco:H=4",), fragments=4),
    # the fine-tuning config's recipe (configs/vit_fleet24_diloco.yaml) at H = 4: fragments, an outer learning rate
    # of 3
    _diloco("diloco-h4-frag4-olr3", 4, 1.0, ("h4-f4",), fragments=4, outer_lr=3.0),
    # shorter rounds with the same recipe, a fragment a step (the config's H of 3 would shorten the default run's
    # budget to a multiple of 12 steps: give it with --method, as run.sh's METHOD)
    _diloco("diloco-h2-frag2-olr3", 2, 1.0, ("h2-f2",), fragments=2, outer_lr=3.0),
)
CONTROLS: Tuple[Method, ...] = (
    Method("ddp-fp32-scratch", {}, None, ("mccl",), random_init=True),
)


def select(names: Optional[Sequence[str]], extra: Sequence[str] = (), controls: bool = False) -> List[Method]:
    """The methods to run, in the table's order: `names` (None: all of them, or, when `extra` names some, none
    of the table's) and the `extra` ones given as NAME=JSON (MCCLStrategy keyword arguments); with `controls`
    (--finetune), CONTROLS are methods too, run last. The reference always runs first. ValueError naming what is
    wrong."""
    table = {m.name: m for m in METHODS + (CONTROLS if controls else ())}
    for item in extra:
        name, sep, text = item.partition("=")
        try:
            kwargs = json.loads(text) if sep and name else None
        except json.JSONDecodeError as e:
            raise ValueError(f"--method {item!r}: the arguments are not JSON ({e})") from None
        if not isinstance(kwargs, dict):
            raise ValueError(f"--method {item!r}: write NAME='{{\"compress\": \"bf16_hook\"}}' (a JSON object of "
                             f"MCCLStrategy keyword arguments)")
        if name in table:
            raise ValueError(f"--method {name}: already a method ({', '.join(table)}); give it another name")
        cls = kwargs.pop("strategy", DDP)
        if cls not in (DDP, DILOCO):
            raise ValueError(f"--method {item!r}: \"strategy\" is {DDP!r} (the default) or {DILOCO!r}")
        table[name] = Method(name, kwargs, None, (name,), cls)
    if names is None:
        names = [] if extra else list(table)
    chosen = list(dict.fromkeys([REFERENCE, *names, *_names(extra)]))
    unknown = [n for n in chosen if n not in table]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; the methods are {', '.join(table)}")
    last = {m.name for m in CONTROLS}
    return sorted((table[n] for n in chosen), key=lambda m: m.name in last)


def _names(extra: Sequence[str]) -> List[str]:
    return [item.partition("=")[0] for item in extra]


def diloco_periods(methods: Sequence[Method]) -> List[int]:
    """The outer-sync periods H of the DiLoCo methods among `methods` (validation falls on multiples of each)."""
    from lightning_mccl.diloco.settings import SYNC_EVERY

    return sorted({int(m.strategy.get("sync_every", SYNC_EVERY)) for m in methods if m.diloco})
