"""What a benchmark compares: labelled series, each a backend plus environment variables for its ranks.

    --series mccl,gloo
    --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:rtol=3e-2:label=mccl-bf16,gloo

Each item is ``BACKEND[:KEY=VALUE]...``: upper-case keys are environment variables of the ranks, lower-case
ones are options of the series (``label``, ``rtol``: the tolerance of its correctness check).

A process group reads its MCCL_* variables when it is made, and the ranks of a launch make one, so series
with different variables cannot share processes: `launch_groups` splits them into separate launches of the ranks. Gloo is unaffected by MCCL_*
variables, so it joins the launch of the first mccl series with no variables of its own, where it is
interleaved with mccl repetition by repetition. An mpi4py series is always a launch of its own (by mpirun).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

BACKENDS = ("mccl", "gloo", "mpi4py")
_ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_OPTIONS = ("label", "rtol")


@dataclass(frozen=True)
class Series:
    label: str
    backend: str
    env: Tuple[Tuple[str, str], ...] = ()
    rtol: Optional[float] = None

    @property
    def env_dict(self) -> Dict[str, str]:
        return dict(self.env)

    def to_json(self) -> dict:
        return {"label": self.label, "backend": self.backend, "env": dict(self.env), "rtol": self.rtol}

    @classmethod
    def from_json(cls, d: dict) -> "Series":
        return cls(d["label"], d["backend"], tuple(sorted(d["env"].items())), d.get("rtol"))


def parse_series(text: str, extra_env: Optional[Dict[str, str]] = None) -> List[Series]:
    """`text` as above; `extra_env` (from --env) goes to every series. ValueError naming the bad item."""
    out: List[Series] = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        backend, *parts = item.split(":")
        if backend not in BACKENDS:
            raise ValueError(f"series {item!r}: unknown backend {backend!r} (use one of {', '.join(BACKENDS)})")
        env = dict(extra_env or {})
        opts: Dict[str, str] = {}
        for part in parts:
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"series {item!r}: {part!r} is not KEY=VALUE")
            if key in _OPTIONS:
                opts[key] = value
            elif _ENV_KEY.match(key):
                env[key] = value
            else:
                raise ValueError(f"series {item!r}: {key!r} is neither an environment variable (upper case) "
                                 f"nor an option ({', '.join(_OPTIONS)})")
        own = {k: v for k, v in env.items() if k not in (extra_env or {})}
        label = opts.get("label") or (backend + "".join(f"[{k}={v}]" for k, v in sorted(own.items())))
        try:
            rtol = float(opts["rtol"]) if "rtol" in opts else None
        except ValueError:
            raise ValueError(f"series {item!r}: rtol={opts['rtol']!r} is not a number") from None
        out.append(Series(label, backend, tuple(sorted(env.items())), rtol))
    if not out:
        raise ValueError("no series given (e.g. --series mccl,gloo)")
    labels = [s.label for s in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"series labels {dup} appear twice: give them label=NAME")
    return out


def launch_groups(series: Sequence[Series]) -> List[List[Series]]:
    """Series that can share one launch of the ranks (see the module docstring), in the order given."""
    groups: List[Tuple[Dict[str, str], List[Series]]] = []
    for s in series:
        if s.backend == "mpi4py":
            groups.append(({"\0mpi": s.label}, [s]))
            continue
        # what decides the launch: the MCCL_* variables for mccl; Gloo ignores them, so its non-MCCL ones
        key = {k: v for k, v in s.env if s.backend == "mccl" or not k.startswith("MCCL_")}
        for gkey, members in groups:
            if _compatible(gkey, key, s.backend):
                members.append(s)
                break
        else:
            groups.append((dict(s.env), [s]))
    return [members for _, members in groups]


def _compatible(group_env: Dict[str, str], key: Dict[str, str], backend: str) -> bool:
    if "\0mpi" in group_env:
        return False
    if backend == "mccl":
        return group_env == key
    other = {k: v for k, v in group_env.items() if not k.startswith("MCCL_")}
    return other == key
