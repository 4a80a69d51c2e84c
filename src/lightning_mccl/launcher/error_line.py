"""The line of a rank's output that says why it failed, for the launcher's last word on a failed job (as
torchrun's "root cause" summary) and `mccl doctor`'s report of a failed measurement.

`first_error(lines)` finds the earliest of:

- a Python exception: the first line after a ``Traceback (most recent call last):`` that is not part of
  a frame (frames are indented), e.g. ``ValueError: MCCLStrategy(compress='bf17'): ...``; torch's
  ``[rankN]: `` prefix is ignored;
- a command-line parser's error (argparse, LightningCLI's jsonargparse): a line ``error: ...`` or
  ``PROG: error: ...``. jsonargparse follows a header such as ``error: Parser key "trainer.strategy":``
  with an indented tree of the nested keys tried; the line then names the innermost key, what it
  expected and the value given: ``error: Parser key "compress": Expected a typing.Literal['bf16', ...];
  given value: bf17``.

`RankTails` is a launcher output stage that keeps the last lines of every rank for it.
"""
from __future__ import annotations

import re
from collections import deque
from typing import Dict, Optional, Sequence

from .prefixed_output import OutputStage

TAIL_LINES = 400  # lines kept per rank: a traceback and a LightningCLI usage text fit with room to spare
TRACEBACK = "Traceback (most recent call last):"
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
_PARSER_ERROR = re.compile(r"^(?:\S+: )?error: ")
_PARSER_KEY = re.compile(r'^\s*Parser key "([^"]+)":\s*$')


def _strip(line: str) -> str:
    return _RANK_PREFIX.sub("", line)


def _exception_after(lines: Sequence[str], start: int) -> Optional[str]:
    for text in lines[start + 1:]:
        if text.strip() and not text[0].isspace():
            return text.strip()
    return None


def _parser_error(lines: Sequence[str], start: int) -> str:
    """The error line at `start`, with jsonargparse's nested detail (the indented lines after it) condensed."""
    head = lines[start].strip()
    detail = []
    for text in lines[start + 1:]:
        if not text.strip() or not text[0].isspace():
            break
        detail.append(text.strip())
    keys = [i for i, text in enumerate(detail) if _PARSER_KEY.match(text)]
    if not head.endswith(":") or not keys:
        return head if not detail or not head.endswith(":") else f"{head} {detail[0]}"
    inner = detail[keys[-1] + 1:]
    expected = next((t[2:] for t in inner if t.startswith("- ")), None)
    given = next((t for t in inner if t.startswith("Given value:")), None)
    line = head[:head.index("error: ") + len("error: ")] + detail[keys[-1]]
    if expected:
        line += f" {expected}"
    if given:
        line += f"; given value:{given[len('Given value:'):]}"
    return line


def first_error(lines: Sequence[str]) -> Optional[str]:
    """The line that says why the output's program failed (see the module docstring), or None."""
    lines = [_strip(t) for t in lines]
    for i, text in enumerate(lines):
        if text.strip() == TRACEBACK:
            found = _exception_after(lines, i)
            if found:
                return found
        elif _PARSER_ERROR.match(text):
            return _parser_error(lines, i)
    return None


class RankTails(OutputStage):
    """An output stage: passes every line on to `output` and keeps each rank's last TAIL_LINES."""

    def __init__(self, output, keep: int = TAIL_LINES):
        super().__init__(output)
        self._keep = keep
        self._tails: Dict[int, deque] = {}

    def line(self, spec, text: str) -> None:
        self._tails.setdefault(spec.rank, deque(maxlen=self._keep)).append(text)
        self._output.line(spec, text)

    def first_error(self, rank: int) -> Optional[str]:
        return first_error(list(self._tails.get(rank, ())))

    def last_line(self, rank: int) -> Optional[str]:
        """The rank's last line that is not blank, or None."""
        return next((t.strip() for t in reversed(self._tails.get(rank, ())) if t.strip()), None)
