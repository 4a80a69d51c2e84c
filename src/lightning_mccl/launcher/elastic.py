"""An elastic job, as the launcher runs it (docs/elastic.md, *Launching*): `mccl launch --elastic`, `mccl join`
and `mccl leave`.

The members of an elastic job decide together, through host 0's Store, who is in (`lightning_mccl.elastic`);
the launcher's part:

- `elastic_plan`: a plan whose ranks go on when one exits (the supervisor runs them without fail-fast) and
  know it (`LaunchPlan.rank_env`), with ``--min-nodes K`` checked against the job's nodes and passed on as the fewest
  members the job goes on with (K times the ranks of one node; with ``--local N``, one node of N ranks, each
  rank counts as a node);
- `join_plan`: one host's ranks, started as joiners of the running job;
- `MembershipLines`: an output stage that keeps the membership changes the members print (one line each, from
  the new quorum's first member) for the launcher's last line, `last_line`;
- `host_zero_outcome`: the job's exit code is host 0's rank's (it serves the Store and ends last);
- `leave_targets` and `ask_to_leave`: the members `mccl leave` names, and the requests it writes to the job's
  leave log. The Store holds nothing secret (docs/reliability.md, *Security*): writing to it needs only its
  address.
"""
from __future__ import annotations

import re
import socket
from dataclasses import replace
from typing import List, Optional, Sequence, Tuple

from .launch_plan import LOCAL_HOST_NAME, LaunchError, LaunchPlan
from .prefixed_output import OutputStage
from .supervisor import Outcome, RankExit
from .terminal import visible

LEAVE_TIMEOUT_S = 10.0  # how long `mccl leave` tries to reach the job's Store
LEAVE_WHY = "mccl leave"  # the reason the members' line gives for a member `mccl leave` asked to leave
# A membership change as a member prints it (ElasticManager._announce), and the class name rank 0's error
# starts with when fewer members remain than the minimum (elastic/errors.py).
CHANGE = re.compile(r"mccl elastic: step (\d+): (.*); (\d+) members now: (.*)$")
TOO_FEW = "TooFewMembers: "
MEMBER_ID = re.compile(r"[mj][0-9]+")


class LeaveError(RuntimeError):
    """`mccl leave` could not write its request (the job's Store cannot be reached, or holds no such member)."""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def node_count(plan: LaunchPlan) -> Tuple[int, int, str]:
    """(nodes, ranks per node, what a node is) as ``--min-nodes`` counts them: the hosts; for ``--local N``,
    one node of N ranks, each rank."""
    if plan.is_local and plan.netns is None and len(plan.hosts) == 1:
        return plan.world_size, 1, "rank"
    return len(plan.hosts), plan.nproc_per_node, "node" if plan.is_local and plan.netns is None else "host"


def elastic_plan(plan: LaunchPlan, min_nodes: Optional[int], source: str) -> LaunchPlan:
    """`plan` as an elastic job that goes on with at least `min_nodes` nodes (None: the elastic layer's
    default); `source` names where the hosts come from, for the error (``fleet.yaml``, ``--local 3``)."""
    count, per_node, what = node_count(plan)
    if min_nodes is not None and min_nodes > count:
        raise LaunchError(f"--min-nodes {min_nodes} is more than the {_plural(count, what)} of {source}: the job "
                          f"would end at once")
    return replace(plan, elastic=True, min_members=None if min_nodes is None else min_nodes * per_node)


def join_plan(plan: LaunchPlan, host: Optional[str], min_nodes: Optional[int], source: str) -> LaunchPlan:
    """Only `host`'s ranks of `plan`, started as joiners of the job that `plan` launched with ``--min-nodes``
    `min_nodes` (``--local``: this machine's ranks, no `host`, and a job whose nodes this plan does not know)."""
    names = [h.name for h in plan.hosts]
    if plan.is_local and plan.netns is None:
        if host is not None:
            raise LaunchError(f"{source} starts its ranks on this machine: give no HOST (got {host})")
        per_node = node_count(plan)[1]
        return replace(plan, elastic=True, joining=LOCAL_HOST_NAME,
                       min_members=None if min_nodes is None else min_nodes * per_node)
    plan = elastic_plan(plan, min_nodes, source)
    if host is None:
        raise LaunchError(f"give the HOST of {source} whose ranks join (one of {', '.join(names)})")
    if host not in names:
        raise LaunchError(f"{host} is not a host of {source} (its hosts: {', '.join(names)})")
    if host == names[0]:
        raise LaunchError(f"{host} is host 0 of {source}: it serves the job's Store, so it cannot join a running "
                          f"job (without it there is none)")
    return replace(plan, joining=host)


def host_zero_outcome(outcome: Outcome) -> Outcome:
    """An elastic job's outcome: rank 0's exit code (others that exited are members that left), unless a
    signal, the timeout or a rank that could not be started ended it."""
    if outcome.reason in ("signal", "timeout", "start"):
        return outcome
    if outcome.signal is not None:
        return Outcome(128 + outcome.signal, "signal", outcome.exits, signal=outcome.signal)
    zero = next(e for e in outcome.exits if e.spec.rank == 0)
    if zero.returncode == 0:
        return Outcome(0, "ok", outcome.exits)
    return Outcome(zero.returncode, "failed", outcome.exits, RankExit(zero.spec, zero.returncode, False))


class MembershipLines(OutputStage):
    """An output stage: passes every line on, and keeps each membership change a member printed, as
    (step, what changed, how many members after, which)."""

    def __init__(self, output):
        super().__init__(output)
        self.changes: List[Tuple[int, str, int, str]] = []

    def line(self, spec, text: str) -> None:
        found = CHANGE.search(visible(text))
        if found:
            self.changes.append((int(found[1]), found[2], int(found[3]), found[4]))
        self._output.line(spec, text)

    def last_line(self, plan: LaunchPlan, outcome: Outcome, failure: str) -> str:
        """The launcher's last line for an elastic job that ended by itself (`outcome` ok or failed: rank 0's);
        `failure`: what `job.failure_line` says of rank 0."""
        changes = "; ".join(f"step {step}: {what}" for step, what, _, _ in self.changes)
        if outcome.reason == "ok" and not self.changes:
            return f"the elastic job finished with its {plan.world_size} launched members: none left or joined"
        if outcome.reason == "ok":
            _, _, count, members = self.changes[-1]
            return f"the elastic job finished with {_plural(count, 'member')} ({members}); changes: {changes}"
        f = outcome.failed
        head = f"failed: rank 0 on {f.spec.host} exited with code {f.returncode}"
        if TOO_FEW in failure:
            head = (f"the elastic job ended because fewer members remain than its minimum (--min-nodes); rank 0 on "
                    f"{f.spec.host} exited with code {f.returncode}")
        return f"{head}{failure}" + (f"; changes before: {changes}" if self.changes else "")


def leave_targets(plan: Optional[LaunchPlan], who: str, source: str) -> List[str]:
    """The members `who` names: a host of `plan` (its launched ranks, m<rank>), or a member id (m<rank>, j<k>, as
    the members' lines name them). LaunchError for anything else, and for host 0's member, which must stay."""
    from ..elastic.membership import member_id

    if plan is not None and who in [h.name for h in plan.hosts]:
        members = [member_id(s.rank) for s in plan.rank_specs(base_env={}) if s.host == who]
    elif MEMBER_ID.fullmatch(who):
        members = [who]
    elif plan is not None:
        raise LaunchError(f"{who} is not a host of {source} (its hosts: {', '.join(h.name for h in plan.hosts)}) "
                          f"nor a member id (m<rank>, j<k>)")
    else:
        raise LaunchError(f"{who} is not a member id (m<rank>, j<k>, as the members' lines name them)")
    if member_id(0) in members:
        raise LaunchError(f"{who} runs {member_id(0)}, host 0's member: it serves the job's Store and must stay for the whole job")
    return members


def ask_to_leave(addr: str, port: int, members: Sequence[str], timeout: float = LEAVE_TIMEOUT_S,
                 why: str = LEAVE_WHY) -> None:
    """Writes a leave request for each of `members` to the leave log of the job whose Store is `addr`:`port`;
    each leaves at its next step boundary. LeaveError when the Store cannot be reached within `timeout` seconds,
    or holds no heartbeat of a member (not an elastic job's Store, or no such member)."""
    try:  # a TCPStore client that cannot connect retries, logging C++ warnings, until its timeout
        socket.create_connection((addr, port), timeout=timeout).close()
    except OSError as e:
        raise LeaveError(f"cannot reach the job's Store at {addr}:{port} (timeout {timeout:g} s): {e.strerror or e}. "
                         f"Is the job running, and are these host 0's address and the job's port?") from None
    from datetime import timedelta

    import torch.distributed as dist

    from ..elastic.board import Board
    from ..elastic.liveness import heartbeat_key
    from ..elastic.membership import request_leave

    try:
        store = dist.TCPStore(addr, port, None, False, timedelta(seconds=timeout), wait_for_workers=False)
    except dist.DistError as e:
        raise LeaveError(f"cannot use the job's Store at {addr}:{port}: {str(e).splitlines()[0]}") from None
    board = Board(store, LEAVE_WHY, f"{addr}:{port}")
    unknown = [m for m in members if not board.has([heartbeat_key(m)])]
    if unknown:
        raise LeaveError(f"the Store at {addr}:{port} holds no heartbeat of {', '.join(unknown)}: is it an elastic "
                         f"job's (mccl launch --elastic), and {'is it' if len(unknown) == 1 else 'are they'} "
                         f"among its members?")
    for m in members:
        request_leave(board, m, why)


__all__ = ["LEAVE_TIMEOUT_S", "LeaveError", "MembershipLines", "ask_to_leave", "elastic_plan", "host_zero_outcome",
           "join_plan", "leave_targets", "node_count"]
