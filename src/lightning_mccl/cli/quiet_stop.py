"""What `mccl launch` shows after Ctrl-C: one line per rank, not every rank's shutdown.

When the launcher forwards a Ctrl-C (or SIGTERM/SIGHUP), every rank shuts down at once: Lightning prints its
graceful-shutdown messages, and a rank still inside a collective sees its peers go and reports the lost
connection, C++ frames included, as if a peer had crashed. None of that is news to the user who pressed
Ctrl-C. `QuietStop` wraps the launcher's output: from the moment the stop is forwarded it withholds each
rank's further lines and, when the rank exits, prints one line instead, ``stopped by the launcher``, with
the rank's exit code and how many lines were withheld. A failure (a rank that exits non-zero on its own)
is never quietened, and with MCCL_DEBUG=INFO (or TRACE) in the launcher's environment nothing is withheld.

The `Supervisor` calls `begin_stop()` when it forwards a signal and `rank_stopped(spec, code)` when a rank
it had asked to stop exits (see `supervise`); every other call goes to the wrapped output.
"""
from __future__ import annotations

import os
from typing import Dict, Mapping, Optional

VERBOSE_LEVELS = ("INFO", "TRACE", "2", "3")


def wants_everything(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when MCCL_DEBUG asks for INFO or more: then the ranks' shutdown output is shown as it comes."""
    environ = os.environ if environ is None else environ
    return environ.get("MCCL_DEBUG", "").strip().upper() in VERBOSE_LEVELS


class QuietStop:
    def __init__(self, output):
        self._output = output
        self._quiet = False
        self._withheld: Dict[int, int] = {}

    def begin_stop(self) -> None:
        self._quiet = True

    def line(self, spec, text: str) -> None:
        if self._quiet:
            self._withheld[spec.rank] = self._withheld.get(spec.rank, 0) + 1
        else:
            self._output.line(spec, text)

    def rank_stopped(self, spec, code: Optional[int]) -> None:
        if not self._quiet:
            return
        n = self._withheld.pop(spec.rank, 0)
        hidden = f"; {n} line{'s' if n != 1 else ''} of its shutdown not shown, MCCL_DEBUG=INFO shows them" if n else ""
        self._output.line(spec, f"stopped by the launcher (exit code {code}){hidden}")

    def flush(self) -> None:
        flush = getattr(self._output, "flush", None)
        if flush is not None:
            flush()
