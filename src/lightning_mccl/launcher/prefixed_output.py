"""Every rank's output on one stream, each line prefixed ``[host rN]`` (`mccl launch`, `mccl doctor`), and
`OutputStage`, the base of the stages that `mccl launch` puts in front of it."""
from __future__ import annotations

import os
import sys
from typing import Dict, Optional, Sequence, TextIO

from .rank_process import RankSpec


class PrefixedOutput:
    """Writes each rank's lines to `stream` (default: stdout) as ``[host rN] line``, prefixes padded to one
    width; colours the prefix on a terminal (unless NO_COLOR is set)."""

    COLORS = (36, 33, 35, 32, 34, 31, 96, 93, 95, 92, 94, 91)

    def __init__(self, specs: Sequence[RankSpec], stream: Optional[TextIO] = None):
        self._stream = stream if stream is not None else sys.stdout
        width = max((len(s.label) + 2 for s in specs), default=0)
        try:
            color = self._stream.isatty() and "NO_COLOR" not in os.environ
        except (AttributeError, ValueError):
            color = False
        self._prefix: Dict[int, str] = {}
        for s in specs:
            tag = f"[{s.label}]"
            pad = " " * (width - len(tag) + 1)
            if color:
                tag = f"\x1b[{self.COLORS[s.rank % len(self.COLORS)]}m{tag}\x1b[0m"
            self._prefix[s.rank] = tag + pad
        self._broken = False

    def line(self, spec: RankSpec, text: str) -> None:
        if self._broken:
            return
        try:
            self._stream.write(self._prefix.get(spec.rank, f"[{spec.label}] ") + text + "\n")
        except BrokenPipeError:  # our stdout is gone (`| head`): keep supervising, stop printing
            self._broken = True

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
