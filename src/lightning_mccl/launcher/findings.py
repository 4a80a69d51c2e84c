"""What a `mccl doctor` check says about one host (`Finding`), and how a check reads the raw command outputs that
`host_probe` collected there (`command_output`). The checks themselves, and their declaration, are
`host_checks`' (which re-exports these names)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    host: str
    check: str
    state: str  # OK, WARN (works, but see the fix) or FAIL (the job will not run, or will hang, until fixed)
    detail: str
    fix: Optional[str] = None  # a command to run on that host, what to change, or the Settings pane to open


def command_output(probe: dict, name: str) -> Optional[Tuple[int, str]]:
    """(exit code, output) of the probe's command `name`; None where it was not asked or did not run."""
    got = (probe.get("commands") or {}).get(name)
    return (got[0], got[1]) if got else None
