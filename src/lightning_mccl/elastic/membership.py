"""Membership: who is in the job at each step boundary, decided once and read by all.

A boundary is a numbered round. Every member of the current quorum posts what it has to say
(``round/<n>/post/<member>``: did its step succeed, does it want to leave, does it hold the training state,
the digest of that state, the members an engine error named), then counts itself in (``round/<n>/count``).
The member whose count completes the quorum decides at once; the others wait for the decision, and, while it
does not come, look at the members that have not posted:

- one named by an engine error (its connection closed) whose heartbeat has been still for `suspect_grace_s`,
  or any whose heartbeat has been still for `silent_after_s`, is gone;
- one whose heartbeat goes on is waited for, at most `timeout`.

Once every member has posted or is gone, any of them may decide. The decision is written once
(``round/<n>/decision``, a compare-and-set on an empty key): whoever writes first, every member reads that one
value, so no two members can act on different memberships. It holds:

- ``commit``: every member of the quorum posted that its step succeeded (a missing post is a no);
- ``members``: the next quorum, in rank order: the members that posted and do not leave, then the joiners
  that posted in time;
- ``receivers``: the next quorum's members without the training state (joiners; at round 0 all but the
  first), which the others send it to;
- ``removed``: who is out, and why; ``reform``: the process group is rebuilt (membership changed or the step
  failed); ``end``: the job cannot go on (too few members, diverged state), and why;
- ``shares``: how many samples of the global batch each member of the next quorum is dealt (in proportion to
  the rates the members posted, ``rates``, when pacing is on: pace.py; else equal).

Joiners register in the join log (``join/<k>``, id ``j<k>``) and post at the round after the latest decided
one (``next``); one that posted in time is admitted, one that did not tries the next round. Requests to leave
come from the member itself (SIGTERM, `request_leave`) or from the leave log (``leave/<k>``, by `mccl leave`).
Host 0 serves the Store and is never let go: its requests to leave are refused.

A joiner whose fingerprint differs from the job's is refused before it registers (fingerprint.py); host 0's
member says so at its next boundary, from the ``refused`` log.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .board import Board, Pauses
from .errors import ElasticError, Removed
from .fingerprint import REFUSED_LOG
from .liveness import Stillness
from .pace import equal_shares, paced_shares
from .settings import ElasticSettings

KEEP_ROUNDS = 8  # decided rounds whose decision stays in the Store (joiners read the latest)


@dataclass(frozen=True)
class Post:
    """What a member says at a boundary."""

    ok: bool  # its step succeeded (every collective, no error reported)
    why: str = ""  # when not ok: the first error
    leaving: str = ""  # why it asks to leave ("it got SIGTERM", "its owner ... logged in"); "": it stays
    has_state: bool = True  # holds the training state (a joiner does not, until it is sent)
    digest: str = ""  # of the state it holds (the sampler's, and the committed step)
    suspects: Tuple[str, ...] = ()  # members an engine error named
    rate: float = 0.0  # its measured samples/s (pace.py); 0 while it has not measured enough steps


@dataclass(frozen=True)
class Decision:
    round: int
    commit: bool
    members: Tuple[str, ...]
    receivers: Tuple[str, ...] = ()
    removed: Dict[str, str] = field(default_factory=dict)
    left: Tuple[str, ...] = ()  # the removed that asked to leave
    reform: bool = False
    reason: str = ""  # why the step is not committed
    end: str = ""  # why the job cannot go on; "" while it can
    too_few: bool = False  # it cannot because fewer than the minimum remain
    shares: Tuple[int, ...] = ()  # each member's samples of the next step's global batch, in `members` order
    rates: Tuple[float, ...] = ()  # the rates they were paced by, as posted (0: none yet)

    def rank_of(self, member: str) -> int:
        return self.members.index(member)


def member_id(rank: int) -> str:
    """The id of a member the launcher started as rank `rank`."""
    return f"m{rank}"


def _post_key(n: int, member: str) -> str:
    return f"round/{n}/post/{member}"


def _decision_key(n: int) -> str:
    return f"round/{n}/decision"


class Membership:
    """This member's side of the rounds. `members`: the current quorum (empty for a joiner until admitted)."""

    def __init__(self, board: Board, me: str, settings: ElasticSettings, members: Sequence[str],
                 store_host: str, say: Callable[[str], None], *, global_batch: int):
        self.board = board
        self.global_batch = global_batch
        self.me = me
        self.settings = settings
        self.members: Tuple[str, ...] = tuple(members)
        self.store_host = store_host
        self.round = 0
        self._say = say
        self._stillness = Stillness(board)
        self._joins_seen = 0
        self._refusals_seen = 0
        self._leaves_seen = 0
        self._joiners: List[str] = []
        self._asked_to_leave: Dict[str, str] = {}

    # ---- joining ------------------------------------------------------------------------------------------

    @staticmethod
    def register_joiner(board: Board, info: dict) -> str:
        """Enter the join log; returns the joiner's member id."""
        return f"j{board.append('join', info)}"

    def _report_refusals(self) -> None:
        """Host 0: one line per joiner refused since its last boundary (fingerprint.py writes the log)."""
        refused, self._refusals_seen = self.board.read_log(REFUSED_LOG, self._refusals_seen)
        for _, entry in refused:
            self._say(f"a joiner on {entry['host']} (pid {entry['pid']}) was refused: {entry['why']}")

    def catch_up(self) -> None:
        """A joiner: post next at the round after the latest decided one."""
        self.round = max(self.round, self.board.add("next", 0))

    # ---- one round ----------------------------------------------------------------------------------------

    def boundary(self, post: Post) -> Decision:
        """Post, then return the decision of this round (this member's or another's)."""
        n = self.round
        if self.me == self.store_host:
            self._report_refusals()
        self.board.set(_post_key(n, self.me), asdict(post))
        if self.me in self.members and self.board.add(f"round/{n}/count", 1) == len(self.members):
            self._decide(n, {})
        decision = self._await_decision(n)
        self._after(n, decision)
        return decision

    def _await_decision(self, n: int) -> Decision:
        start = time.monotonic()
        pauses = Pauses()
        next_look = start
        while True:
            if self.board.has([_decision_key(n)]):
                return _decision(self.board.get(_decision_key(n)))
            if not self.members and time.monotonic() - start >= self.settings.timeout:
                raise ElasticError(f"joiner {self.me}: the running job decided no step boundary within "
                                   f"{self.settings.timeout:g} s (the elastic timeout): is it still running?")
            if self.me in self.members and time.monotonic() >= next_look:
                if self.board.add("next", 0) > n and not self.board.has([_decision_key(n)]):
                    # decided (`next` moves on after the decision is written), and deleted since: long behind
                    raise Removed(f"mccl elastic: member {self.me} fell more than {KEEP_ROUNDS} step boundaries "
                                  f"behind (it was stopped or stalled): the job went on without it")
                gone = self._gone(n, time.monotonic() - start)
                if gone is not None:
                    self._decide(n, gone)
                    continue
                next_look = time.monotonic() + self.settings.heartbeat_s
            pauses.sleep()

    def _gone(self, n: int, waited: float) -> Optional[Dict[str, str]]:
        """The members that have not posted, each with why it is gone; None while one may still come."""
        missing = [m for m in self.members if not self.board.has([_post_key(n, m)])]
        posted = [m for m in self.members if m not in missing]
        suspects = set()
        for post in self.board.get_many([_post_key(n, m) for m in posted]):
            suspects.update(post["suspects"])
        gone = {}
        for m in missing:
            still = self._stillness.still_for(m)
            if m in suspects and still >= self.settings.suspect_grace_s:
                gone[m] = f"a collective failed on it and its heartbeat stopped ({still:.1f} s)"
            elif still >= self.settings.silent_after_s:
                gone[m] = f"its heartbeat stopped for {still:.1f} s"
            elif waited >= self.settings.timeout:
                gone[m] = (f"it did not reach the step boundary within {self.settings.timeout:g} s (the elastic "
                           f"timeout)")
            else:
                return None
        return gone

    def _decide(self, n: int, gone: Dict[str, str]) -> None:
        posted = [m for m in self.members if m not in gone]
        if self.board.has([_decision_key(n)]) or not self.board.has([_post_key(n, m) for m in posted]):
            return  # decided already (the posts of an old round may be gone)
        self._read_logs()
        posts = dict(zip(posted, (Post(**{**p, "suspects": tuple(p["suspects"])})
                                  for p in self.board.get_many([_post_key(n, m) for m in posted]))))
        joiners = [j for j in self._joiners if j not in self.members and self.board.has([_post_key(n, j)])]
        for j, p in zip(joiners, self.board.get_many([_post_key(n, j) for j in joiners])):
            posts[j] = Post(**{**p, "suspects": tuple(p["suspects"])})
        removed = dict(gone)
        left = []
        for m in posted:
            why = posts[m].leaving or self._asked_to_leave.get(m)
            if why and m == self.store_host:
                self._say(f"member {m} serves the Store on host 0 and must stay: its request to leave is refused")
            elif why:
                removed[m] = why
                left.append(m)
        members = tuple(m for m in posted if m not in removed) + tuple(joiners)
        failed = [f"member {m} is gone: {why}" for m, why in gone.items()]
        errors = [m for m in self.members if m in posts and not posts[m].ok]
        if errors:
            more = f" (and {len(errors) - 1} other members failed too)" if len(errors) > 1 else ""
            failed.append(f"member {errors[0]} failed: {posts[errors[0]].why}{more}")
        commit = n > 0 and not failed
        holders = [m for m in members if posts[m].has_state]
        digests = {posts[m].digest for m in holders}
        end = ""
        too_few = len(members) < self.settings.min_members
        if too_few:
            end = (f"{len(members)} members remain, fewer than the minimum of {self.settings.min_members} "
                   f"(removed: {_listed(removed)})")
        elif not holders:
            end = "no remaining member holds the training state to send to the others"
        elif len(digests) > 1:
            end = "members disagree on the training state: " + ", ".join(f"{m}: {posts[m].digest}" for m in holders)
        rates = tuple(posts[m].rate if self.settings.pace else 0.0 for m in members)
        decision = Decision(
            round=n, commit=commit, members=members, receivers=tuple(m for m in members if not posts[m].has_state),
            removed=removed, left=tuple(left), reform=members != self.members or not commit, reason="; ".join(failed),
            end=end, too_few=too_few, shares=self._shares(rates), rates=rates)
        if self.board.set_once(_decision_key(n), asdict(decision)) == _json(decision):
            self._advance_next(n + 1)
            if n >= KEEP_ROUNDS:
                self.board.delete(_decision_key(n - KEEP_ROUNDS))
                self.board.delete(f"round/{n - KEEP_ROUNDS}/count")

    def _shares(self, rates: Tuple[float, ...]) -> Tuple[int, ...]:
        if not rates:
            return ()
        if not self.settings.pace:
            return equal_shares(len(rates), self.global_batch)
        return paced_shares(rates, self.global_batch, self.settings.pace_min_share)

    def _advance_next(self, n: int) -> None:
        """`next` (the round after the latest decided) := n unless it is past n already (compare-and-set: it
        never goes back)."""
        current = self.board.add("next", 0)
        while current < n:
            current = self.board.compare_set("next", current, n)

    def _read_logs(self) -> None:
        joins, self._joins_seen = self.board.read_log("join", self._joins_seen)
        self._joiners.extend(f"j{index}" for index, _ in joins if f"j{index}" not in self.members)
        leaves, self._leaves_seen = self.board.read_log("leave", self._leaves_seen)
        for _, entry in leaves:
            self._asked_to_leave[entry["member"]] = entry.get("why", "it was asked to leave")

    def _after(self, n: int, decision: Decision) -> None:
        """Take the decision as this member's view: the next quorum, the next round, the Store tidied."""
        if n > 0:
            self.board.delete(_post_key(n - 1, self.me))
        for m in decision.members:
            if m in self._joiners:
                self._joiners.remove(m)
        for m in decision.removed:
            self._stillness.forget(m)
            self._asked_to_leave.pop(m, None)
        if self.me in decision.members or self.me in self.members:
            self.members = decision.members
        self.round = n + 1


def request_leave(board: Board, member: str, why: str) -> None:
    """Ask `member` to leave at the next step boundary (what `mccl leave` does, through the Store)."""
    board.append("leave", {"member": member, "why": why})


def _listed(removed: Dict[str, str]) -> str:
    return "; ".join(f"{m}: {why}" for m, why in removed.items()) or "none"


def _json(decision: Decision):
    """The decision as the Store returns it (lists where the dataclass holds tuples)."""
    return json.loads(json.dumps(asdict(decision)))


def _decision(value: dict) -> Decision:
    return Decision(**{**value, **{k: tuple(value[k]) for k in ("members", "receivers", "left", "shares", "rates")}})


__all__ = ["Membership", "Post", "Decision", "member_id", "request_leave"]
