"""`mccl launch`'s end-of-job summary: the straggler table and communication line of the fit.

Every rank is started with $MCCL_SUMMARY_MARKER set; at the end of a fit, `CommMetrics` on rank 0 prints
its summary record as one line, the marker and then JSON. `SummaryTap` sits between the ranks and the
prefixed output: it passes every other line through, keeps the latest record instead of printing it, and
`text()` renders it (`straggler.summary_text`) for the launcher to print once every rank has ended.
"""
from __future__ import annotations

import json
from typing import Optional

from ..straggler import SUMMARY_MARKER_ENV, summary_text
from .prefixed_output import OutputStage

MARKER = "@mccl-summary"


class SummaryTap(OutputStage):
    """An output stage; see the module docstring."""

    def __init__(self, output) -> None:
        super().__init__(output)
        self.record: Optional[dict] = None

    def line(self, spec, text: str) -> None:
        if text.startswith(MARKER + " "):
            try:
                self.record = json.loads(text[len(MARKER) + 1:])
                return
            except ValueError:
                pass  # not ours after all: shown as it is
        self._output.line(spec, text)

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
