"""A rank whose peer went away says so in one line, not in a traceback.

When one rank fails, the ranks in a collective with it lose their connection to it at once, often before
the launcher has seen the failed rank exit (its process still prints its own traceback and tears down), so
before `quiet_stop` withholds anything: each of them would print a hundred lines of traceback that end in
``MCCL connection error: rank 1 lost its connection to rank 0 ...``, which tell nothing the failed rank's
error does not. `PeerLoss` holds a rank's traceback until its exception line arrives: when that is a lost
peer (`error_line.is_peer_loss`) the rank shows that line alone, saying that its traceback is not shown;
any other traceback is shown whole, as it came. With MCCL_DEBUG=INFO the launcher leaves this stage out.
"""
from __future__ import annotations

import re
from typing import Dict, List, Tuple

from .error_line import CHAINED, TAIL_LINES, TRACEBACK, is_peer_loss, strip_rank_prefix
from .prefixed_output import OutputStage
from .terminal import visible

# The first line of a chained exception (a type, maybe dotted, then its message).
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b")


class PeerLoss(OutputStage):
    def __init__(self, output, max_held: int = TAIL_LINES):
        super().__init__(output)
        self._max = max_held
        self._held: Dict[int, Tuple[object, List[str]]] = {}  # rank: (spec, a traceback's lines), no exception yet
        self._hiding = set()  # ranks whose lost-peer traceback is being left out

    def line(self, spec, text: str) -> None:
        plain = strip_rank_prefix(visible(text))
        rank = spec.rank
        if rank in self._hiding:
            if not plain.strip() or plain[0].isspace() or plain.strip() in (TRACEBACK, *CHAINED) or \
                    _EXCEPTION.match(plain):
                return  # the rest of the traceback, or of the exceptions chained to it
            self._hiding.discard(rank)
        if rank not in self._held:
            if plain.strip() == TRACEBACK:
                self._held[rank] = (spec, [text])
            else:
                self._output.line(spec, text)
            return
        held = self._held[rank][1]
        held.append(text)
        if plain.strip() and not plain[0].isspace():  # the exception
            if is_peer_loss(plain):
                del self._held[rank]
                self._hiding.add(rank)
                self._output.line(spec, f"{plain.strip()} (its traceback not shown: it lost a peer; "
                                        "MCCL_DEBUG=INFO shows it)")
            else:
                self._release(rank)
        elif len(held) >= self._max:
            self._release(rank)

    def _release(self, rank: int) -> None:
        """A held traceback shown as it came (not a lost peer's, or cut off)."""
        spec, lines = self._held.pop(rank, (None, ()))
        for text in lines:
            self._output.line(spec, text)

    def rank_exited(self, spec, code) -> None:
        self._release(spec.rank)
        self._hiding.discard(spec.rank)
        self.forward("rank_exited", spec, code)

    def finish(self) -> None:
        for rank in list(self._held):
            self._release(rank)
        self.forward("finish")
