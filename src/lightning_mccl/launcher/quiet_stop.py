"""What `mccl launch` shows when it stops the ranks: one line per rank, not every rank's shutdown.

When the launcher forwards a Ctrl-C (or SIGTERM/SIGHUP), every rank shuts down at once: Lightning prints its
graceful-shutdown messages, and a rank still inside a collective sees its peers go and reports the lost
connection, C++ frames included, as if a peer had crashed. None of that is news to the user who pressed
Ctrl-C. Nor is it after a rank failed and the launcher stopped the others: the first failure's own output
is what says why (a rank killed with kill -9 says nothing; the others then print tracebacks about the lost
peer, one per exception handler on the way out). `QuietStop` wraps the launcher's output: from the moment
the stop begins it withholds each stopped rank's further lines and, when the rank exits, prints one line
instead, ``stopped by the launcher``, with the rank's exit code, how many lines were withheld and, after
a failure, the first error among them (`error_line`). The failed rank's own lines are never withheld, and
with MCCL_DEBUG=INFO (or TRACE) in the launcher's environment nothing is.

The `Supervisor` calls `begin_stop(failed)` when it forwards a signal (failed: None) or stops the others
after the rank `failed` failed, and `rank_stopped(spec, code)` when a rank it had asked to stop exits (see
`supervisor`); every other call goes to the wrapped output.
"""
from __future__ import annotations

import os
from collections import deque
from typing import Dict, Mapping, Optional

from .error_line import TAIL_LINES, first_error
from .prefixed_output import OutputStage

VERBOSE_LEVELS = ("INFO", "TRACE", "2", "3")


def wants_everything(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when MCCL_DEBUG asks for INFO or more: then the ranks' shutdown output is shown as it comes."""
    environ = os.environ if environ is None else environ
    return environ.get("MCCL_DEBUG", "").strip().upper() in VERBOSE_LEVELS


class QuietStop(OutputStage):
    def __init__(self, output):
        super().__init__(output)
        self._quiet = False
        self._failed = None  # the spec of the rank whose failure began the stop (None: a signal did)
        self._withheld: Dict[int, int] = {}
        self._tails: Dict[int, deque] = {}  # after a failure: each stopped rank's last withheld lines

    def begin_stop(self, failed=None) -> None:
        if not self._quiet:
            self._quiet, self._failed = True, failed

    def line(self, spec, text: str) -> None:
        if not self._quiet or (self._failed is not None and spec.rank == self._failed.rank):
            self._output.line(spec, text)
            return
        self._withheld[spec.rank] = self._withheld.get(spec.rank, 0) + 1
        if self._failed is not None:
            self._tails.setdefault(spec.rank, deque(maxlen=TAIL_LINES)).append(text)

    def update(self, spec, text: str) -> None:
        """A progress bar's redraw (`progress`): dropped, like a line, once the stop began."""
        if not self._quiet or (self._failed is not None and spec.rank == self._failed.rank):
            self.forward("update", spec, text)

    def rank_stopped(self, spec, code: Optional[int]) -> None:
        if not self._quiet:
            return
        n = self._withheld.pop(spec.rank, 0)
        error = first_error(list(self._tails.pop(spec.rank, ())))
        after = f" after rank {self._failed.rank} failed" if self._failed is not None else ""
        hidden = ""
        if n:
            hidden = f"; {n} line{'s' if n != 1 else ''} of its shutdown not shown"
            hidden += f" (the first error: {error})" if error else ""
            hidden += ", MCCL_DEBUG=INFO shows them"
        note = getattr(self._output, "note", self._output.line)  # never taken for another rank's copy
        note(spec, f"stopped by the launcher{after} (exit code {code}){hidden}")
