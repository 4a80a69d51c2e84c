"""`mccl launch`: one command, every rank of the fleet.

    mccl launch --hostfile fleet.yaml -- python train.py fit --config vit.yaml
    mccl launch --local 2 -- python train.py fit --config vit.yaml      # 2 ranks on this machine

Host i of the hostfile (see `lightning_mccl.hostfile`) runs ``--nproc-per-node`` ranks (default 1), each
reached by its own ``ssh`` connection (also the host you launch from), in the launcher's working directory
(or ``--chdir``), with torchrun's environment: MASTER_ADDR (host 0's addr), MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK (and GROUP_RANK, MCCL_NODE_RANK), plus MCCL_SOCKET_IFNAME from the
host's ``ifname``. ``--local N`` runs N ranks on this machine over loopback (MASTER_ADDR=127.0.0.1, a free
port), no ssh, as one node: LOCAL_RANK 0..N-1, NODE_RANK 0, as ``torchrun --nproc-per-node N`` gives, for
``Trainer(devices=N)``; ``--local N --nproc-per-node P`` makes this machine N nodes of P ranks each (NODE_RANK
0..N-1), so that ``Trainer(num_nodes=N, devices=P)`` runs unchanged on one machine. ``--switch TAG`` runs
host i's ranks inside host i of the emulated switch TAG (`mccl switch up`, Linux and root only): MASTER_ADDR
is host 0's address there and MCCL_SOCKET_IFNAME its interface, so the ranks talk over the shaped links.
Every rank also gets TORCHELASTIC_RUN_ID (one id per job), torchrun's marker, so Lightning reads these
variables through its TorchElasticEnvironment: a ``Trainer(num_nodes=..., devices=...)`` whose product is not
WORLD_SIZE fails at once on every rank, as under torchrun; MCCL_HOSTS (the host names, in node order: the
rendezvous names the hosts of missing ranks with it); and MCCL_CAFFEINATE (``--caffeinate``: on a macOS host
the rank shim runs ``caffeinate -dims -w PID`` for the rank, so the Mac does not sleep during the job).
``--port-range LOW-HIGH`` sets MCCL_PORT_RANGE: the engine's listeners bind only those ports.

What every rank also gets: the launcher's MCCL_* variables (engine tuning such as MCCL_DEBUG; per-host
ones excepted), the ``--env`` variables, PYTHONUNBUFFERED=1 (so output streams as it is printed) unless
set, and, as torchrun does, OMP_NUM_THREADS=1 when several ranks share a machine and it is not set.
These travel in the rank's spec over the rank shim's stdin (through ssh's encrypted channel), never on a
command line: ``ps`` shows every user the argv of the shim and of ssh, and the environment may hold
MCCL_AUTH_SECRET or an API token. On the host, only the rank's own user (and root) can read its environment.
``--env NAME=VALUE`` is on the launcher's own command line, though: ``--env NAME`` takes the value from the
launcher's environment instead, and a NAME=VALUE whose name looks secret (SECRET_NAME) gets a warning.
A command that starts with ``python``/``python3`` runs with ``--python`` (default: the launcher's own
interpreter), because a non-interactive ssh shell has no virtual environment activated.

Supervision (see `supervise`): output prefixed ``[host rN]`` on stdout, a line that several ranks print
alike shown once (`same_lines`); the first rank to fail stops all the others, each of which then shows one
line, not its shutdown (`quiet_stop`), and its exit code is the launcher's, whose last line names that
rank's first error line (`error_line`); Ctrl-C (SIGINT) is forwarded to every rank as SIGINT, anything
still alive ``--grace`` seconds later is killed, and the launcher exits with 130. MCCL_DEBUG=INFO in the
launcher's environment shows every line of every rank.

Restarts (``--max-restarts N``): when a rank fails, every rank is stopped as above and then all of them
are started again, up to N times; the job resumes from its own checkpoints (e.g. Lightning's
``ckpt_path="last"``). Each attempt rendezvouses afresh: on a new free port with ``--local`` (unless
``--master-port`` is given), else on the same port, which the previous attempt's store released when its
processes ended. Every rank gets MCCL_RESTART_COUNT (0 on the first attempt) and MCCL_MAX_RESTARTS, and
torchrun's names for them, TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS. Ctrl-C, a signal to
the launcher, or a rank that cannot be started at all ends the job without a restart; after the last
restart the launcher exits with the last failing rank's code. Why not torchrun's elastic agent: it needs
an agent started by hand on every Mac and a rendezvous backend between them; `mccl launch` already
controls every host from one command (over ssh), so restarting the whole job from there needs nothing more.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
from dataclasses import replace
from typing import List, Mapping, Optional, Sequence

from ..hostfile import HostfileError
from . import fleet_summary
from .error_line import RankTails
from .fleet_args import _non_negative_int, _port_range, _positive_int, add_fleet_arguments, plan_from_args
from .launch_plan import LaunchError, LaunchPlan, resolve_command
from .prefixed_output import PrefixedOutput
from .quiet_stop import QuietStop, wants_everything
from .same_lines import SameLines
from .supervise import Outcome, Supervisor


EPILOG = """\
every rank gets torchrun's variables: MASTER_ADDR (host 0's addr), MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK (= GROUP_RANK = MCCL_NODE_RANK), and MCCL_SOCKET_IFNAME from the
host's ifname; TORCHELASTIC_RUN_ID (Lightning then checks num_nodes x devices against WORLD_SIZE).
--local N: N ranks on this machine as one node (LOCAL_RANK 0..N-1, as torchrun --nproc-per-node N), for
Trainer(devices=N); --local N --nproc-per-node P: N nodes of P ranks each, for Trainer(num_nodes=N, devices=P).

output: every line of every rank, prefixed [host rN], on stdout; the launcher's messages on stderr.
exit code: the first failing rank's (the others are stopped at once), 130 after Ctrl-C, 0 when all succeed.
--max-restarts N: after a failure, all ranks start again (up to N times; MCCL_RESTART_COUNT says which
attempt); the exit code is then the last attempt's.
"""
# An --env NAME=VALUE whose NAME matches this gets a warning: its value is on the launcher's command line.
SECRET_NAME = re.compile(r"SECRET|TOKEN|KEY|PASSWORD|PASS", re.IGNORECASE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fleet_arguments(parser)
    parser.add_argument("--nproc-per-node", metavar="P", type=_positive_int,
                        help="ranks per host (default: 1; one Mac, one rank); with --local N: this machine as N "
                             "nodes of P ranks each")
    parser.add_argument("--max-restarts", metavar="N", type=_non_negative_int, default=0,
                        help="when a rank fails, stop all ranks and start them all again, up to N times "
                             "(default: 0); ranks see MCCL_RESTART_COUNT")
    parser.add_argument("--caffeinate", action=argparse.BooleanOptionalAction, default=None,
                        help="keep each host awake while its ranks run (`caffeinate -dims`); default: on for "
                             "macOS hosts, off elsewhere")
    parser.add_argument("--port-range", metavar="LOW-HIGH", type=_port_range,
                        help="the only ports ranks listen on while connecting (sets MCCL_PORT_RANGE; "
                             "e.g. 29600-29700), so a firewall can allow them; default: any free port")
    parser.add_argument("--env", metavar="NAME[=VALUE]", action="append", default=[],
                        help="set NAME for every rank; repeatable. NAME alone takes the value from the launcher's "
                             "environment and keeps it off the command line, where `ps` shows NAME=VALUE to "
                             "every user of this machine: use it for secrets")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command every rank runs, after --")


def parse_env(items: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> dict:
    environ = os.environ if environ is None else environ
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise LaunchError(f"--env {item!r}: {name!r} is not a variable name")
        if not sep:
            if name not in environ:
                raise LaunchError(f"--env {name}: {name} is not set here (use --env {name}=VALUE)")
            value = environ[name]
        out[name] = value
    return out


def secret_names_with_values(items: Sequence[str]) -> List[str]:
    """The names in --env `items` given as NAME=VALUE that look like secrets (SECRET_NAME)."""
    return [name for name, sep, _ in (item.partition("=") for item in items) if sep and SECRET_NAME.search(name)]


def warn_secret_values(items: Sequence[str], log) -> None:
    """Logs, for each secret-looking --env NAME=VALUE, that the value is on the command line (never the value)."""
    for name in secret_names_with_values(items):
        log(f"warning: --env {name}=... puts the value of {name} on this command line, where `ps` shows it to every "
            f"user of this machine; export {name} and give --env {name} instead")


def supervise(plan: LaunchPlan, *, log, **kwargs) -> Outcome:
    """Runs `plan` under a Supervisor (kwargs: output, fail_fast, timeout)."""
    return Supervisor(plan.rank_specs(), log=log, grace=plan.grace, explain_exit=plan.explain_exit,
                      **kwargs).run()


def job_output(plan: LaunchPlan):
    """The launcher's output for one attempt, outermost first: every rank's last lines (`error_line`), one
    line per stopped rank (`quiet_stop`), a line printed alike by several ranks once (`same_lines`), rank 0's
    summary kept for the end (`fleet_summary`), prefixed lines on stdout; MCCL_DEBUG=INFO: every line.
    Returns (output, summary)."""
    summary = fleet_summary.SummaryTap(PrefixedOutput(plan.rank_specs()))
    return RankTails(summary if wants_everything() else QuietStop(SameLines(summary))), summary


def failure_line(outcome: Outcome, output: RankTails) -> str:
    """"; its first error: ..." for the failed rank of `outcome` (`error_line`); else, when it exited by itself
    (code 1-127, not killed by a signal), "; its last line: ..."; else ""."""
    rank, code = outcome.failed.spec.rank, outcome.failed.returncode
    error = output.first_error(rank)
    if error:
        return f"; its first error: {error}"
    last = output.last_line(rank) if code is not None and 0 < code < 128 else None
    return f"; its last line: {last}" if last else ""


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]]) -> int:
    """`mccl launch`: returns the exit code (parser.error exits 2 on bad input)."""
    from .console import make_log, stderr_console

    if command is not None and args.command:
        parser.error("give the command once, after --")
    command = list(command if command is not None else args.command)
    if not command:
        parser.error("missing the command to run, e.g. mccl launch --local 2 -- python train.py")
    try:
        env = {**fleet_summary.rank_env(), **parse_env(args.env)}
        if args.port_range:
            env["MCCL_PORT_RANGE"] = args.port_range
        command, replaced = resolve_command(command, args.python)
        plan = plan_from_args(args, command, nproc_per_node=args.nproc_per_node, env=env)
    except (LaunchError, HostfileError) as e:
        parser.error(str(e))
    caffeinate = {None: "auto", True: "on", False: "off"}[args.caffeinate]
    plan = replace(plan, max_restarts=args.max_restarts, caffeinate=caffeinate)
    log = make_log(stderr_console())
    warn_secret_values(args.env, log)
    log(f"launching {plan.describe()}: {shlex.join(plan.command)}")
    if replaced:
        log(f"`python` runs as {plan.python} (see --python)")
    fresh_port = args.local is not None and args.master_port is None
    while True:
        output, summary = job_output(plan)
        outcome = supervise(plan, log=log, output=output)
        if outcome.reason != "failed" or outcome.signal is not None or plan.restart >= plan.max_restarts:
            break  # a signal ends the job, also one that came while the ranks stopped after a failure
        f = outcome.failed
        plan = plan.next_attempt(fresh_port)
        log(f"rank {f.spec.rank} on {f.spec.host} failed with exit code {f.returncode}: restarting all "
            f"{plan.world_size} ranks (restart {plan.restart} of {plan.max_restarts}, master port {plan.master_port})"
            f"{failure_line(outcome, output)}")
    if outcome.reason == "ok":
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
    if summary.text():
        print(summary.text(), flush=True)
    return outcome.returncode
