"""One `mccl launch` job: its attempts (``--max-restarts``), the output stages in front of the terminal,
and the launcher's last word.

`run_job(plan, log=...)` supervises every rank of `plan` (`supervisor`); when a rank fails and restarts
are left, it stops the others, logs why (the failed rank's first error, `error_line`) and starts every rank
again (`LaunchPlan.next_attempt`: restart + 1, a fresh port for ``--local`` unless one was given). A signal
ends the job, also one that came while the ranks stopped after a failure. Its last log line says how the
job ended, with the failed rank's first error or last line; `JobResult.summary` is rank 0's fit summary
(`fleet_summary`), for the caller to print after that line. An elastic plan (`elastic`) runs its ranks
without fail-fast: a rank that exits is a member that left, a host that left without being asked starts again
as a joiner once it answers ssh (`elastic.Rejoins`), the job's exit code is rank 0's, and the last line lists
every membership change the members printed.

The output of an attempt, outermost first (`job_output`): every rank's last lines (`error_line.RankTails`),
an elastic job's membership changes (`elastic.MembershipLines`),
one line per stopped rank (`quiet_stop`), one line for a traceback that only says a peer went away
(`peer_loss`), a line printed alike by several ranks once (`same_lines`), rank
0's summary kept for the end (`fleet_summary`), progress bars live or now and then (`progress`), prefixed
lines on stdout; with MCCL_DEBUG=INFO every line as it came.
"""
from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, replace
from typing import Callable, Optional

from .elastic import MembershipLines, Rejoins, host_zero_outcome
from .error_line import RankTails, is_peer_loss
from .fleet_summary import SummaryTap, rank_env as summary_env
from .launch_plan import LaunchPlan
from .peer_loss import PeerLoss
from .prefixed_output import PrefixedOutput, prefix_width
from .progress import PROGRESS_EVERY_S, ProgressLines, rank_env as progress_env
from .quiet_stop import QuietStop, wants_everything
from .same_lines import SameLines
from .supervisor import Outcome, supervise
from .terminal import columns


@dataclass(frozen=True)
class JobResult:
    outcome: Outcome  # the last attempt's
    plan: LaunchPlan  # the last attempt's (its restart count)
    summary: Optional[str]  # rank 0's fit summary, or None


@dataclass(frozen=True)
class JobOutput:
    stages: RankTails  # the outermost stage: what the Supervisor writes to
    summary: SummaryTap
    terminal: PrefixedOutput  # the innermost: clear_live() before a message of the launcher's own
    membership: Optional[MembershipLines] = None  # an elastic job's membership changes


def job_output(plan: LaunchPlan, progress_every: float = PROGRESS_EVERY_S) -> JobOutput:
    """The launcher's output for one attempt (see the module docstring)."""
    terminal = PrefixedOutput(plan.rank_specs())
    summary = SummaryTap(ProgressLines(terminal, progress_every))
    stages = summary if wants_everything() else QuietStop(PeerLoss(SameLines(summary)))
    membership = MembershipLines(stages) if plan.elastic else None
    return JobOutput(RankTails(membership or stages), summary, terminal, membership)


def failure_line(outcome: Outcome, output: RankTails) -> str:
    """"; its first error: ..." for the failed rank of `outcome` (`error_line`), and when that only says that
    it lost a peer, "; the cause, rank N's first error: ..." of a rank whose error is another; else, when it
    exited by itself (code 1-127, not killed by a signal), "; its last line: ..."; else "". Then, where a rank's
    output named a known cause (`known_causes`: macOS's GPU watchdog, a lost host), ". The cause: ...", with
    what to do."""
    rank, code = outcome.failed.spec.rank, outcome.failed.returncode
    named = output.named_cause(rank)
    named = f". The cause: {named}" if named else ""
    error = output.first_error(rank)
    if error:
        cause = ""
        if is_peer_loss(error):
            others = ((r, output.first_error(r)) for r in output.ranks() if r != rank)
            root = next(((r, e) for r, e in others if e and not is_peer_loss(e)), None)
            cause = f"; the cause, rank {root[0]}'s first error: {root[1]}" if root else ""
        return f"; its first error: {error}{cause}{named}"
    last = output.last_line(rank) if code is not None and 0 < code < 128 else None
    return (f"; its last line: {last}" if last else "") + named


def run_job(plan: LaunchPlan, *, log: Callable[[str], None], fresh_port: bool = False,
            progress_every: float = PROGRESS_EVERY_S) -> JobResult:
    """Runs `plan` to its end, restarting every rank after a failure up to plan.max_restarts times (on a new
    free port when `fresh_port`); `log` gets the launcher's own lines. Every rank also gets the variables
    that make rank 0 report its fit summary to the launcher (`fleet_summary`) and its progress bar redraw
    on the launcher's pipe (`progress`, shown live or every `progress_every` seconds)."""
    width = columns(sys.stdout) - prefix_width(plan.rank_specs())
    plan = replace(plan, env={**summary_env(), **progress_env(width), **plan.env})
    launcher_log = log
    while True:
        job = job_output(plan, progress_every)
        output, summary = job.stages, job.summary
        log = _clearing(launcher_log, job.terminal)
        rejoins = Rejoins(output, plan, log) if plan.elastic and plan.joining is None and plan.ssh else None
        try:
            outcome = supervise(plan, log=log, output=rejoins or output, fail_fast=not plan.elastic,
                                more=rejoins.due if rejoins else None)
        finally:
            if rejoins is not None:
                rejoins.close()
        if plan.elastic and plan.joining is None:
            outcome = host_zero_outcome(outcome)
        if outcome.reason != "failed" or outcome.signal is not None or plan.restart >= plan.max_restarts:
            break  # a signal ends the job, also one that came while the ranks stopped after a failure
        f = outcome.failed
        plan = plan.next_attempt(fresh_port)
        log(f"rank {f.spec.rank} on {f.spec.host} failed with exit code {f.returncode}: restarting all "
            f"{plan.world_size} ranks (restart {plan.restart} of {plan.max_restarts}, master port {plan.master_port})"
            f"{failure_line(outcome, output)}")
    if job.membership is not None and plan.joining is None and outcome.reason in ("ok", "failed"):
        log(job.membership.last_line(plan, outcome, failure_line(outcome, output) if outcome.failed else ""))
    elif outcome.reason == "ok":
        log(f"all {plan.world_size} ranks finished" + (f" (after {plan.restart} restart{'s' if plan.restart > 1 else ''})"
                                                       if plan.restart else ""))
    elif outcome.reason == "failed":
        f = outcome.failed
        tail = f" (no restarts left after {plan.restart})" if plan.max_restarts else ""
        if outcome.signal is not None and plan.restart < plan.max_restarts:
            tail = f" (not restarted: the launcher got {signal.Signals(outcome.signal).name})"
        log(f"failed: rank {f.spec.rank} on {f.spec.host} exited with code {f.returncode}{tail}"
            f"{failure_line(outcome, output)}")
    else:
        log(f"stopped ({outcome.reason}); exit code {outcome.returncode}")
    return JobResult(outcome, plan, summary.text())


def _clearing(log: Callable[[str], None], terminal: PrefixedOutput) -> Callable[[str], None]:
    """`log`, after erasing the live progress line (the message goes to the same terminal, on stderr)."""
    def say(message: str) -> None:
        terminal.clear_live()
        log(message)

    return say
