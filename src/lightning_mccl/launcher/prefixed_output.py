"""Every rank's output on one stream, each line prefixed ``[host rN]`` (`mccl launch`, `mccl doctor`), and
`OutputStage`, the base of the stages that `mccl launch` puts in front of it.

On a terminal one rank's progress may also be drawn in place (`update`, see `progress`): the live line,
below every other line. It is redrawn with a carriage return, cut to the terminal's width; another line is
written over it and the live line drawn again after it, and `clear_live` erases it before the launcher
writes a message of its own (on stderr, the same terminal). The rank's next line of its own ends it."""
from __future__ import annotations

import os
import sys
from typing import Dict, Optional, Sequence, TextIO, Tuple

from .rank_process import RankSpec
from .terminal import ERASE_TO_END, RESET, clip, columns, is_terminal, shown


def prefix_width(specs: Sequence[RankSpec]) -> int:
    """The width of the ``[host rN] `` prefixes of `specs` (padded to the longest, a space after it)."""
    return max((len(s.label) + 3 for s in specs), default=0)


class PrefixedOutput:
    """Writes each rank's lines to `stream` (default: stdout) as ``[host rN] line``, prefixes padded to one
    width; on a terminal (`live`) colours the prefix (unless NO_COLOR is set) and keeps the ranks' colours,
    elsewhere writes plain text (see `terminal`)."""

    COLORS = (36, 33, 35, 32, 34, 31, 96, 93, 95, 92, 94, 91)

    def __init__(self, specs: Sequence[RankSpec], stream: Optional[TextIO] = None):
        self._stream = stream if stream is not None else sys.stdout
        self.width = prefix_width(specs)
        self.live = is_terminal(self._stream)
        color = self.live and "NO_COLOR" not in os.environ
        self._prefix: Dict[int, str] = {}
        for s in specs:
            tag = f"[{s.label}]"
            pad = " " * (self.width - len(tag))
            if color:
                tag = f"\x1b[{self.COLORS[s.rank % len(self.COLORS)]}m{tag}\x1b[0m"
            self._prefix[s.rank] = tag + pad
        self._live_line: Optional[Tuple[RankSpec, str]] = None  # (rank, text) of the line drawn in place
        self._drawn = False
        self._broken = False

    def _prefixed(self, spec: RankSpec, text: str) -> str:
        return self._prefix.get(spec.rank, f"[{spec.label}] ") + shown(text, self.live)

    def _write(self, text: str) -> None:
        if self._broken:
            return
        try:
            self._stream.write(text)
        except BrokenPipeError:  # our stdout is gone (`| head`): keep supervising, stop printing
            self._broken = True

    def line(self, spec: RankSpec, text: str) -> None:
        if self._live_line is not None and self._live_line[0].rank == spec.rank:
            self._live_line = None  # the rank's own line ends its progress: written over it
        self.clear_live()
        self._write(self._prefixed(spec, text) + "\n")
        self._draw()

    def update(self, spec: RankSpec, text: str) -> None:
        """`text` as the live line (a progress bar's new state), in place of the last one; a line elsewhere."""
        if not self.live:
            self.line(spec, text)
            return
        self._live_line = (spec, text)
        self._draw()

    def _draw(self) -> None:
        if self._live_line is None:
            return
        spec, text = self._live_line
        width = max(10, columns(self._stream) - self.width - 1)
        self._write("\r" + self._prefix.get(spec.rank, "") + clip(shown(text, True), width) + RESET + ERASE_TO_END)
        self._drawn = True

    def clear_live(self) -> None:
        """Erases the live line (drawn again with the next line or update); flushes."""
        if self._drawn:
            self._write("\r" + ERASE_TO_END)
            self._drawn = False
        self.flush()

    def rank_exited(self, spec: RankSpec, code) -> None:
        if self._live_line is not None and self._live_line[0].rank == spec.rank:
            self._live_line = None
            self.clear_live()

    def finish(self) -> None:
        self._live_line = None
        self.clear_live()

    def flush(self) -> None:
        if self._broken:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._broken = True


class OutputStage:
    """A stage of the launcher's output in front of another output (`output`): lines go on to it, and so do
    the Supervisor's hooks (see `supervisor`) this stage does not have itself."""

    def __init__(self, output):
        self._output = output

    def line(self, spec, text: str) -> None:
        self._output.line(spec, text)

    def forward(self, hook: str, *args) -> None:
        """Calls the next output's `hook` when it has one."""
        method = getattr(self._output, hook, None)
        if method is not None:
            method(*args)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._output, name)
