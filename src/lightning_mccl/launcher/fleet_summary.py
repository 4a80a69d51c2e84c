"""`mccl launch`'s end-of-job summary: the straggler table, the communication line and the mode line (the
communication mode and its measured accuracy cost) of the fit.

Every rank is started with $MCCL_SUMMARY_MARKER set; at the end of a fit, `CommMetrics` on rank 0 prints
its summary record as one line, the marker and then JSON. `SummaryTap` sits between the ranks and the
prefixed output: it passes every other line through, keeps the latest record instead of printing it, and
`text()` renders it (`straggler.summary_text`) for the launcher to print once every rank has ended.

The line may come cut into several: a progress bar that redraws itself (rich's, `progress`) takes over the
rank's stdout while it runs and wraps every printed line at the terminal's width, keeping the spaces at the
ends of the pieces. So a record that does not parse yet is held, with the lines that follow it, until their
concatenation parses (shown as it came when it never does: at most WRAPPED_LINES lines, or when the rank
exits).
"""
from __future__ import annotations

import json
from typing import Dict, List, Optional

from ..straggler import SUMMARY_MARKER_ENV, summary_text
from .prefixed_output import OutputStage
from .terminal import visible

MARKER = "@mccl-summary"
WRAPPED_LINES = 400  # the most pieces of one record held before giving up on it


class SummaryTap(OutputStage):
    """An output stage; see the module docstring."""

    def __init__(self, output) -> None:
        super().__init__(output)
        self.record: Optional[dict] = None
        self._held: Dict[Optional[int], List[str]] = {}  # rank: the lines of a record not complete yet

    def line(self, spec, text: str) -> None:
        rank = getattr(spec, "rank", None)
        held = self._held.get(rank)
        if held is None and not visible(text).startswith(MARKER + " {"):
            self._output.line(spec, text)
            return
        held = self._held.setdefault(rank, [])
        held.append(text)
        joined = "".join(visible(t) for t in held)
        try:
            self.record = json.loads(joined[len(MARKER) + 1:])
            del self._held[rank]
        except ValueError:
            if len(held) >= WRAPPED_LINES:
                self._release(spec)

    def _release(self, spec) -> None:
        """A rank's held lines, shown as they came: not a record of ours after all."""
        for text in self._held.pop(getattr(spec, "rank", None), ()):
            self._output.line(spec, text)

    def rank_exited(self, spec, code) -> None:
        self._release(spec)
        self.forward("rank_exited", spec, code)

    def text(self) -> Optional[str]:
        """The summary of the last fit that reported one, or None."""
        if self.record is None:
            return None
        try:
            return "fleet summary (rank 0's CommMetrics):\n" + summary_text(self.record)
        except (KeyError, TypeError, ValueError) as e:
            return f"fleet summary: unreadable ({e!r})"


def rank_env() -> dict:
    """What every rank gets so that rank 0 reports its summary to the tap."""
    return {SUMMARY_MARKER_ENV: MARKER}
