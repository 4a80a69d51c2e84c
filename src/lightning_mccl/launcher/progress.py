"""Rank 0's progress while a job runs, as torchrun users see it.

Under torchrun rank 0's progress bar writes to the terminal itself and redraws itself in place; the other
ranks' Lightning bars are off. Under the launcher a rank writes to a pipe, and Lightning's default bar
(rich) then draws nothing until the end of fit: an hour-long job would look hung. So every rank is told
that its output is terminal compatible (`rank_env`: rich's TTY_COMPATIBLE and TTY_INTERACTIVE, and COLUMNS,
the width left after the launcher's prefix), unless the launcher's own environment says otherwise; a tqdm
bar redraws itself on a pipe anyway. A redraw arrives as a piece of output ended by a carriage return, not
a newline (`RankProcess.split_marked`), and reaches `ProgressLines.update`:

- when the launcher's stdout is a terminal, rank 0's redraws are drawn in place, one live line below the
  other output (`PrefixedOutput.update`), as the bar looks under torchrun;
- otherwise (a file, a pipe, a CI log), and for the other ranks' redraws, a redraw becomes an ordinary line
  at most every `every_s` seconds per rank (``mccl launch --progress-every``, default 30 s; the first at
  once), as a status line (`status_line`: the bar's text without the bar, colours or cursor movements): a
  log gets the epoch, step, times, rate and logged loss now and then, not thousands of lines.

The bar's last state, which the bar ends with a newline, is an ordinary line everywhere.
"""
from __future__ import annotations

import os
import re
import time
from typing import Callable, Dict, Mapping, Optional

from .prefixed_output import OutputStage
from .terminal import visible

PROGRESS_EVERY_S = 30.0
LIVE_RANK = 0  # the rank whose progress is drawn in place (Lightning's bar is on global rank 0 only)
# A progress bar's bar: box-drawing and block characters (rich's, tqdm's), left out of a log's status line.
_BAR = re.compile(r"\s*[\u2500-\u259f]+\s*")
# What a rank is told about its output (rich >= 14 reads them; COLUMNS: also Python's get_terminal_size).
TERMINAL_VARS = ("TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS")


def rank_env(columns: int, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables that make a rank's progress bar redraw on the launcher's pipe, `columns` wide; none that
    the launcher's environment sets itself (TTY_COMPATIBLE=0 there turns this off)."""
    environ = os.environ if environ is None else environ
    want = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": str(max(40, columns))}
    if environ.get("TTY_COMPATIBLE") == "0":
        return {}
    return {k: v for k, v in want.items() if k not in environ}


class ProgressLines(OutputStage):
    """An output stage in front of `PrefixedOutput` (whose `live` says it writes to a terminal); see the
    module docstring."""

    def __init__(self, output, every_s: float = PROGRESS_EVERY_S, clock: Callable[[], float] = time.monotonic):
        super().__init__(output)
        self._terminal = bool(getattr(output, "live", False))
        self._every = every_s
        self._clock = clock
        self._shown_at: Dict[int, float] = {}

    def update(self, spec, text: str) -> None:
        if not visible(text).strip():
            return  # a bare control sequence (cursor hidden, line erased)
        if self._terminal and spec.rank == LIVE_RANK:
            self._output.update(spec, text)
            return
        now = self._clock()
        last = self._shown_at.get(spec.rank)
        if last is None or now - last >= self._every:
            self._shown_at[spec.rank] = now
            self._output.line(spec, status_line(text))


def status_line(text: str) -> str:
    """A progress bar's redraw as a line of a log: its text (epoch, step, times, rate, the logged values),
    without escape sequences or the bar itself."""
    return _BAR.sub(" ", visible(text)).strip()
