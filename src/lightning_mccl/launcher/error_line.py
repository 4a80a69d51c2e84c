"""The line of a rank's output that says why it failed, for the launcher's last word on a failed job (as
torchrun's "root cause" summary) and `mccl doctor`'s report of a failed measurement.

`first_error(lines)` finds the earliest of:

- a Python traceback (torch's ``[rankN]: `` prefix ignored). A traceback may chain several exceptions ("The
  above exception was the direct cause of ...", "During handling of ..."); the line names the innermost
  one that the project raised, i.e. the first whose raising frame is the user's code or lightning_mccl's,
  not a library's or the standard library's (`project_file`): ``RuntimeError: CIFAR-10 is not in data/...``
  rather than the ``socket.gaierror`` under it. When no exception is the project's, and a LightningCLI
  (jsonargparse) instantiation error lists the errors of each type it tried, the line is the error the
  project's class raised (``MCCLStrategy(...): expected ...``), not jsonargparse's ``Expected a <class
  'str'>. Got value: Namespace(...)``; else the first exception of the chain;
- a command-line parser's error (argparse, LightningCLI's jsonargparse): a line ``error: ...`` or
  ``PROG: error: ...``. jsonargparse follows a header such as ``error: Parser key "trainer.strategy":``
  with an indented tree of the nested keys tried; the line then names the innermost key, what it
  expected and the value given: ``error: Parser key "compress": Expected a typing.Literal['bf16', ...];
  given value: bf17``.

`is_peer_loss(line)` says whether an error line is a rank's report that a peer went away (its connection
closed, reset or aborted): the consequence of another rank's failure, rarely its cause (`peer_loss`).

`RankTails` is a launcher output stage that keeps the last lines of every rank for it, and each rank's first
line that names a known cause (`known_causes`: macOS's GPU watchdog, a lost host), wherever in its output.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .known_causes import KnownCause, known_cause
from .prefixed_output import OutputStage
from .terminal import visible

TAIL_LINES = 400  # lines kept per rank: a traceback and a LightningCLI usage text fit with room to spare
TRACEBACK = "Traceback (most recent call last):"
CHAINED = ("The above exception was the direct cause of the following exception:",
           "During handling of the above exception, another exception occurred:")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
_PARSER_ERROR = re.compile(r"^(?:\S+: )?error: ")
_PARSER_KEY = re.compile(r'^\s*Parser key "([^"]+)":\s*$')
_FRAME = re.compile(r'^\s+File "([^"]+)", line \d+')
# Where the standard library and installed packages live: a frame there is not the project's own.
_LIBRARY = re.compile(r"[/\\](?:site-packages|dist-packages|lib[/\\]python\d[\d.]*)[/\\]|^<frozen ")
# What a rank reports when a peer went away under it (mccl's and Gloo's words, and NCCL's).
_PEER_LOSS = re.compile(r"lost its connection to rank|Connection closed by peer|Connection reset by peer|"
                        r"MCCL aborted: rank \d+|remote process exited or there was a network error")
# A type jsonargparse tried and the value did not fit (the other errors of its list are the classes' own).
_TYPE_MISMATCH = re.compile(r"^(?:Expected a |Not a valid |Import path |Does not validate |Given value)")


def strip_rank_prefix(line: str) -> str:
    return _RANK_PREFIX.sub("", line)


def project_file(path: str) -> bool:
    """Whether a traceback frame's file is the project's: lightning_mccl's, or the user's (not installed)."""
    return "lightning_mccl" in path or not _LIBRARY.search(path)


def is_peer_loss(line: str) -> bool:
    return _PEER_LOSS.search(line) is not None


@dataclass
class Raised:
    """One exception of a printed traceback: the file of its last frame (None: no frame was printed), its
    first line (``Type: message``) and the lines of its message after that one."""
    file: Optional[str]
    line: str
    more: List[str] = field(default_factory=list)


def traceback_chain(lines: Sequence[str], start: int) -> Tuple[List[Raised], int]:
    """The exceptions of the traceback (chain) whose header is lines[start], and the index after it."""
    chain: List[Raised] = []
    i = start
    while i < len(lines) and lines[i].strip() == TRACEBACK:
        i += 1
        file = None
        while i < len(lines) and (not lines[i].strip() or lines[i][0].isspace()):
            frame = _FRAME.match(lines[i])
            file = frame.group(1) if frame else file
            i += 1
        if i == len(lines):
            break  # cut off before its exception
        raised = Raised(file, lines[i].strip())
        i += 1
        while i < len(lines) and lines[i].strip() and lines[i].strip() != TRACEBACK:
            raised.more.append(lines[i].strip())
            i += 1
        chain.append(raised)
        j = i
        while j < len(lines) and (not lines[j].strip() or lines[j].strip() in CHAINED):
            j += 1
        if j < len(lines) and lines[j].strip() == TRACEBACK and any(t.strip() in CHAINED for t in lines[i:j]):
            i = j
        else:
            break
    return chain, i


def _class_error(raised: Raised) -> Optional[str]:
    """The error a class raised that jsonargparse lists under ``Errors:`` among the types it tried, or None."""
    if "Errors:" not in raised.more:
        return None
    items = []
    for text in raised.more[raised.more.index("Errors:") + 1:]:
        if not text.startswith("- "):
            break
        items.append(text[2:])
    own = [t for t in items if not _TYPE_MISMATCH.match(t)]
    return own[0] if len(own) == 1 else None


def chain_error(chain: Sequence[Raised]) -> Optional[str]:
    """The line that names a traceback chain's error (see the module docstring)."""
    ours = [r for r in chain if r.file is not None and project_file(r.file)]
    if ours:
        return ours[0].line
    for raised in reversed(chain):
        own = _class_error(raised)
        if own:
            return own
    return chain[0].line if chain else None


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
    lines = [strip_rank_prefix(visible(t)) for t in lines]
    i = 0
    while i < len(lines):
        text = lines[i]
        if text.strip() == TRACEBACK:
            chain, end = traceback_chain(lines, i)
            found = chain_error(chain)
            if found:
                return found
            i = max(end, i + 1)
            continue
        if _PARSER_ERROR.match(text):
            return _parser_error(lines, i)
        i += 1
    return None


class RankTails(OutputStage):
    """An output stage: passes every line on to `output` and keeps each rank's last TAIL_LINES, and the first
    known cause each rank's output names."""

    def __init__(self, output, keep: int = TAIL_LINES):
        super().__init__(output)
        self._keep = keep
        self._tails: Dict[int, deque] = {}
        self._causes: Dict[int, Tuple[str, KnownCause]] = {}  # rank: (its host, the cause)

    def line(self, spec, text: str) -> None:
        self._tails.setdefault(spec.rank, deque(maxlen=self._keep)).append(text)
        if spec.rank not in self._causes:
            cause = known_cause(text)
            if cause is not None:
                self._causes[spec.rank] = (spec.host, cause)
        self._output.line(spec, text)

    def named_cause(self, rank: int) -> Optional[str]:
        """The known cause `rank`'s output named, else the first other rank's (in rank order), explained; None."""
        found = self._causes.get(rank) or next((self._causes[r] for r in sorted(self._causes)), None)
        return found[1].explain.format(host=found[0]) if found else None

    def first_error(self, rank: int) -> Optional[str]:
        return first_error(list(self._tails.get(rank, ())))

    def ranks(self) -> List[int]:
        """The ranks that printed anything, in rank order."""
        return sorted(self._tails)

    def last_line(self, rank: int) -> Optional[str]:
        """The rank's last line that is not blank, or None."""
        return next((t.strip() for t in reversed(self._tails.get(rank, ())) if t.strip()), None)
