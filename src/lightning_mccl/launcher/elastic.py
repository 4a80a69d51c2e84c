"""An elastic job, as the launcher runs it (docs/elastic.md, *Launching*): `mccl launch --elastic`, `mccl join`
and `mccl leave`.

The members of an elastic job decide together, through host 0's Store, who is in (`lightning_mccl.elastic`);
the launcher's part:

- `elastic_plan`: a plan whose ranks go on when one exits (the supervisor runs them without fail-fast) and
  know it (`LaunchPlan.rank_env`), with ``--min-nodes K`` checked against the job's nodes and passed on as the
  fewest members the job goes on with (K times the ranks of one node; with ``--local N``, one node of N ranks,
  each rank counts as a node);
- `join_plan`: one host's ranks, started as joiners of the running job;
- `MembershipLines`: an output stage that keeps the membership changes the members print (one line each, from
  the new quorum's first member) for the launcher's last line, `last_line`;
- `host_zero_outcome`: the job's exit code is host 0's rank's (it serves the Store and ends last);
- `Rejoins` (over ssh): a host that left without being asked (its ranks exited with a non-zero code: it crashed,
  lost its network, slept and was taken out) is probed with ``ssh HOST true`` every REJOIN_PROBE_S seconds
  while rank 0 runs, and once it answers its ranks start again as joiners, at most REJOINS_PER_HOST times; a
  host that left as asked (exit code 0: `mccl leave`, SIGTERM) stays out;
- `leave_targets` and `ask_to_leave`: the members `mccl leave` names, and the requests it writes to the job's
  leave log. The Store holds nothing secret (docs/reliability.md, *Security*): writing to it needs only its
  address.
"""
from __future__ import annotations

import re
import socket
import subprocess
import time
from collections import Counter
from dataclasses import replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .launch_plan import LOCAL_HOST_NAME, LaunchError, LaunchPlan, ssh_argv
from .prefixed_output import OutputStage
from .rank_process import RankSpec
from .supervisor import Outcome, RankExit
from .terminal import visible

REJOIN_PROBE_S = 10.0  # between ssh probes of a host that left
REJOINS_PER_HOST = 3  # the most times one host's ranks are started again
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


class Rejoins(OutputStage):
    """An output stage of an elastic job over ssh that sees every rank exit (see the module docstring); `due()`,
    which the supervisor polls, probes the hosts that left and returns the ranks to start again. `close()` ends
    the probes still running."""

    def __init__(self, output, plan: LaunchPlan, log: Callable[[str], None], probe_s: float = REJOIN_PROBE_S):
        super().__init__(output)
        self._plan, self._log, self._probe_s = plan, log, probe_s
        self._running = Counter({h.name: plan.nproc_per_node for h in plan.hosts})
        self._codes: Dict[str, List[int]] = {h.name: [] for h in plan.hosts}
        self._next_probe: Dict[str, float] = {}  # the hosts that left: when to probe each next
        self._probes: Dict[str, subprocess.Popen] = {}
        self._restarts: Counter = Counter()
        self._left: List[str] = []  # the hosts that left since the last `due`, said there (after the exit's line)
        self._zero_ended = False

    def rank_exited(self, spec, code) -> None:
        host = spec.host
        self._running[host] -= 1
        self._codes[host].append(code)
        if spec.rank == 0:
            self._zero_ended = True
        elif self._running[host] == 0 and any(c != 0 for c in self._codes[host]):
            self._left.append(host)
        self.forward("rank_exited", spec, code)

    def due(self) -> List[RankSpec]:
        """The ranks of the hosts that answered ssh since the last call, as joiners."""
        specs: List[RankSpec] = []
        if self._zero_ended:
            return specs
        for host in self._left:
            if self._restarts[host] < REJOINS_PER_HOST:
                self._log(f"{host} left (its ranks exited with code {', '.join(map(str, self._codes[host]))}): "
                          f"starting it again as a joiner once it answers ssh")
                self._next_probe[host] = time.monotonic()
            else:
                self._log(f"{host} left again after {REJOINS_PER_HOST} restarts: not starting it again (`mccl join` "
                          f"does it by hand)")
        self._left.clear()
        for host, at in list(self._next_probe.items()):
            probe = self._probes.get(host)
            if probe is None:
                if time.monotonic() >= at:
                    self._probes[host] = subprocess.Popen(
                        ssh_argv(self._plan.ssh, host, ["true"]), stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
                continue
            if probe.poll() is None:
                continue
            del self._probes[host]
            if probe.returncode != 0:
                self._next_probe[host] = time.monotonic() + self._probe_s
                continue
            del self._next_probe[host]
            self._restarts[host] += 1
            self._codes[host] = []
            joiners = replace(self._plan, joining=host).rank_specs()
            self._running[host] = len(joiners)
            self._log(f"{host} answers ssh again: starting it as a joiner ({_plural(len(joiners), 'rank')}; restart "
                      f"{self._restarts[host]} of at most {REJOINS_PER_HOST})")
            specs += joiners
        return specs

    def close(self) -> None:
        for probe in self._probes.values():
            if probe.poll() is None:
                probe.kill()
            probe.wait()
        self._probes.clear()


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
        raise LaunchError(f"{who} runs {member_id(0)}, host 0's member: it serves the job's Store and must stay for "
                          f"the whole job")
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


__all__ = ["LEAVE_TIMEOUT_S", "REJOIN_PROBE_S", "REJOINS_PER_HOST", "LeaveError", "MembershipLines", "Rejoins",
           "ask_to_leave", "elastic_plan", "host_zero_outcome", "join_plan", "leave_targets", "node_count"]
