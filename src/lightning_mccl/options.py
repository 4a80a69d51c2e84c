"""Per-group settings of the mccl backend, as ProcessGroupNCCL.Options / ncclConfig_t give NCCL's.

A group reads its settings once, when it is made: each MCCL_* variable from these options when they name
it, else from the environment at that moment. Nothing changes them afterwards, so two groups can differ,
and a variable set after one group was made applies to the groups made after that (docs/settings.md).

    import lightning_mccl
    opts = lightning_mccl.Options(spin_us=0, allgather_algo="bruck")    # or Options({"MCCL_SPIN_US": "0"})
    dist.init_process_group("mccl", pg_options=opts)                    # the default group
    small = dist.new_group([0, 1], backend="mccl", pg_options=lightning_mccl.Options(algo="rd"))

A plain dict {"MCCL_SPIN_US": 0} is accepted as pg_options too. Values are what the variable takes, as
strings or numbers; the engine checks them (and rejects names it does not know) when the group is made.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional


class Options:
    """The settings of one mccl process group: MCCL_* variable name -> value."""

    def __init__(self, settings: Optional[Mapping[str, object]] = None, **variables: object):
        self.settings: Dict[str, str] = {}
        for name, value in dict(settings or {}).items():
            self[name] = value
        for key, value in variables.items():  # spin_us=0 -> MCCL_SPIN_US
            self["MCCL_" + key.upper()] = value

    def __setitem__(self, name: str, value: object) -> None:
        if not isinstance(name, str) or not name.startswith("MCCL_"):
            raise ValueError(f"lightning_mccl.Options: {name!r} is not an MCCL_* variable name")
        self.settings[name] = _text(name, value)

    def __getitem__(self, name: str) -> str:
        return self.settings[name]

    def __repr__(self) -> str:
        shown = {k: ("<hidden>" if k == "MCCL_AUTH_SECRET" else v) for k, v in self.settings.items()}
        return f"lightning_mccl.Options({shown})"


def _text(name: str, value: object) -> str:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"lightning_mccl.Options: {name}={value!r} is not a value the variable takes")
    return str(value)


def settings_of(backend_options: object) -> Dict[str, str]:
    """The settings dict for ProcessGroupMCCL from torch's pg_options (None, Options or a dict)."""
    if backend_options is None:
        return {}
    if isinstance(backend_options, Options):
        return dict(backend_options.settings)
    if isinstance(backend_options, Mapping):
        return dict(Options(backend_options).settings)
    raise TypeError(f"the mccl backend takes pg_options=lightning_mccl.Options(...) or a dict of MCCL_* "
                    f"variables, not {type(backend_options).__name__}")
