"""`mccl launch` shows a line that several ranks print alike once, not once per rank.

N ranks that fail alike at start-up (a typo in the config, a missing file) each print the same error, and
LightningCLI's 80 lines of usage before it: N interleaved copies, with the one useful line lost among them.
`SameLines` sits in the launcher's output (see `supervisor`): a rank's line is shown as it comes unless
another rank has already shown the same text more often than this rank has printed it so far; such a
copy is held back and counted. When the rank next shows a line of its own, or exits, one line says how
many of its lines were held back and whose copy was shown (`note` passes the launcher's own lines about a
rank, such as `quiet_stop`'s, on as they are):
``[mac-1 r1] (80 lines as mac-0 r0 printed them above, not shown; MCCL_DEBUG=INFO shows them)``.
A line is shown the first time, at once, so nothing is delayed (Ray deduplicates its workers' logs alike).
With MCCL_DEBUG=INFO the launcher leaves this stage out (`quiet_stop.wants_everything`).

The texts are remembered up to MAX_TEXTS, the least recently printed forgotten first, so that a long job's
output does not grow the launcher's memory.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List

from .prefixed_output import OutputStage

MAX_TEXTS = 4096


class _Text:
    __slots__ = ("shown", "printed", "first")

    def __init__(self, first: str):
        self.shown = 0  # times it was shown, by any rank
        self.printed: Dict[int, int] = {}  # times each rank printed it
        self.first = first  # the label of the rank that showed it first


class SameLines(OutputStage):
    def __init__(self, output, max_texts: int = MAX_TEXTS):
        super().__init__(output)
        self._max = max_texts
        self._texts: "OrderedDict[str, _Text]" = OrderedDict()
        self._held: Dict[int, List] = {}  # rank: [spec, lines held back, labels of the ranks that showed them]

    def line(self, spec, text: str) -> None:
        seen = self._texts.get(text)
        if seen is None:
            seen = self._texts[text] = _Text(spec.label)
            if len(self._texts) > self._max:
                self._texts.popitem(last=False)
        else:
            self._texts.move_to_end(text)
        mine = seen.printed.get(spec.rank, 0)
        seen.printed[spec.rank] = mine + 1
        if seen.shown > mine:  # another rank showed this text more often: a copy
            held = self._held.setdefault(spec.rank, [spec, 0, set()])
            held[1] += 1
            held[2].add(seen.first)
            return
        self._say_held(spec.rank)
        seen.shown += 1
        self._output.line(spec, text)

    def note(self, spec, text: str) -> None:
        """A line of the launcher's own about the rank (after what it held back): never held back itself."""
        self._say_held(spec.rank)
        self._output.line(spec, text)

    def _say_held(self, rank: int) -> None:
        held = self._held.pop(rank, None)
        if held is None:
            return
        spec, n, shown_by = held
        who = next(iter(shown_by)) if len(shown_by) == 1 else "other ranks"
        self._output.line(spec, f"({n} line{'s' if n != 1 else ''} as {who} printed {'it' if n == 1 else 'them'} "
                                f"above, not shown; MCCL_DEBUG=INFO shows them)")

    def rank_exited(self, spec, code) -> None:
        """Called by the Supervisor when a rank exits (after its output, as far as it came)."""
        self._say_held(spec.rank)
        self.forward("rank_exited", spec, code)

    def finish(self) -> None:
        """Called by the Supervisor at the end: what is still held back (output that came after an exit)."""
        for rank in list(self._held):
            self._say_held(rank)
        self.forward("finish")
