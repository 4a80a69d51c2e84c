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
the rank shim runs ``caffeinate -ims -w PID`` for the rank, so the Mac does not sleep during the job; the
display may, which keeps macOS 26's GPU watchdog away).
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

Supervision (the library `lightning_mccl.launcher`: `supervisor`, `job`): output prefixed ``[host rN]`` on
stdout, a line that several ranks print alike shown once (`same_lines`), rank 0's progress bar live or now
and then (`progress`); the first rank to fail stops all the others, each of which then shows one line, not
its shutdown (`quiet_stop`; a rank that only lost its peer: one line, `peer_loss`), and its exit code is
the launcher's, whose last line names that rank's first error line (`error_line`: the project's own
message where there is one); Ctrl-C (SIGINT) is forwarded to every rank as SIGINT, anything still alive
``--grace`` seconds later is killed, and the launcher exits with 130. MCCL_DEBUG=INFO in the launcher's
environment shows every line of every rank.

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

Elastic (``--elastic [--min-nodes K]``, for a program driven by `lightning_mccl.elastic.ElasticManager`): a
rank that exits, with any code, stops no other; the members go on without it, and each membership change is one
line of theirs. Every rank gets MCCL_ELASTIC=1 and, with ``--min-nodes K``, MCCL_ELASTIC_MIN_MEMBERS (K times
the ranks of a node; with ``--local N`` each rank counts as a node), which ``ElasticManager.from_env`` reads: fewer
members end the job; with ``--leave-on-login``, MCCL_ELASTIC_LEAVE_ON_LOGIN=1: a rank leaves when someone logs in
at its Mac's screen (lightning_mccl.elastic.owner), exits 0 and is not started again. The exit code is rank 0's (host 0 serves the Store and must stay); the last line lists the
membership changes, or says that the job ended because fewer members than the minimum remained. Over ssh, a
host that left without being asked (its ranks exited with a non-zero code) starts again as a joiner once it
answers ``ssh HOST true`` (`lightning_mccl.launcher.elastic.Rejoins`). `mccl leave` asks a host to leave, and
`mccl join` starts one as a joiner by hand; both are in this module too:

`mccl leave (--hostfile F HOST | --master ADDR:PORT MEMBER)` writes one request per member to the leave log in
the job's Store on host 0 (the hostfile's host 0 and its master_port, or --master-port; or ADDR:PORT: a
``--local`` job's launcher says ``master 127.0.0.1:PORT``), and prints one line. Each member leaves at its next
step boundary, after its step is applied everywhere, and exits 0; the members print the change (``m2 left (mccl
leave)``). Members are named as the members' lines name them: ``m<rank>`` for a launched rank, ``j<k>`` for a
joiner; a host of the hostfile names its launched ranks' members (give the job's --nproc-per-node). Host 0's
member serves the Store and is refused. The Store holds nothing secret, so this needs no secret. Exit codes: 0;
1 when the Store cannot be reached within --timeout or holds no such member; 2 for bad input.

`mccl join (--hostfile F HOST | --local N --master-port PORT) -- COMMAND` starts that host's ranks as `mccl
launch` would start them (over ssh, in the working directory, with the same environment: give the options the
job was launched with: --nproc-per-node, --master-port, --env, --min-nodes), plus MCCL_ELASTIC=1 and
MCCL_ELASTIC_JOIN=1, which makes ``ElasticManager.from_env`` register them as joiners at the job's Store: the
members admit them at a step boundary and send them the training state. Host 0 cannot join (it serves the
Store). With ``--local N`` the job is one on this machine, on --master-port. Output and exit code as `mccl
launch`'s.
"""
from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from typing import Optional, Sequence

from ..hostfile import HostfileError
from ..launcher import LaunchError, parse_env, resolve_command, run_job, warn_secret_values
from ..launcher import fleet_plan
from ..launcher.elastic import LEAVE_TIMEOUT_S, LeaveError, ask_to_leave, elastic_plan, join_plan, leave_targets
from ..launcher.progress import PROGRESS_EVERY_S
from .arg_types import address_port, non_negative_int, port, port_range, positive_int, positive_seconds, seconds
from .console import make_log, stderr_console
from .fleet_args import add_fleet_arguments, plan_from_args


EPILOG = """\
every rank gets torchrun's variables: MASTER_ADDR (host 0's addr), MASTER_PORT, WORLD_SIZE, RANK,
LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK (= GROUP_RANK = MCCL_NODE_RANK), and MCCL_SOCKET_IFNAME from the
host's ifname; TORCHELASTIC_RUN_ID (Lightning then checks num_nodes x devices against WORLD_SIZE).
--local N: N ranks on this machine as one node (LOCAL_RANK 0..N-1, as torchrun --nproc-per-node N), for
Trainer(devices=N); --local N --nproc-per-node P: N nodes of P ranks each, for Trainer(num_nodes=N, devices=P).

output: every line of every rank, prefixed [host rN], on stdout; the launcher's messages on stderr. Rank 0's
progress bar is drawn in place on a terminal, and is a line every --progress-every seconds in a log.
exit code: the first failing rank's (the others are stopped at once), 130 after Ctrl-C, 0 when all succeed.
--max-restarts N: after a failure, all ranks start again (up to N times; MCCL_RESTART_COUNT says which
attempt); the exit code is then the last attempt's.
--elastic [--min-nodes K] (a program using lightning_mccl.elastic): a rank that exits stops no other; each
membership change is one line; the exit code is rank 0's, and the last line lists who left and joined, and why,
or says that fewer than the minimum remained. Over ssh, a host whose ranks exited with a non-zero code starts
again as a joiner once it answers ssh. mccl leave asks a host to leave; mccl join starts one by hand.
"""

JOIN_EPILOG = """\
the ranks get what mccl launch gives that host's ranks, plus MCCL_ELASTIC=1 and MCCL_ELASTIC_JOIN=1
(ElasticManager.from_env then joins the running job at MASTER_ADDR:MASTER_PORT); give the job's own options
(--master-port, --nproc-per-node, --env, --min-nodes) and its command after --. Host 0 cannot join.
"""

LEAVE_EPILOG = """\
the request goes to the leave log in the job's Store (host 0's address and the job's port); each member named
leaves at its next step boundary and exits 0, and the members print the change as one line. Members: m<rank>
(a launched rank), j<k> (a joiner), as the members' lines name them; a HOST of the hostfile: its launched ranks.
exit code: 0; 1 when the Store cannot be reached or holds no such member; 2 for bad input (host 0 must stay).
"""


def add_arguments(parser: argparse.ArgumentParser, joining: bool = False) -> None:
    """`mccl launch`'s options; `joining`: `mccl join`'s (the same, but for --max-restarts and --elastic: its
    ranks are always elastic), and the HOST that joins."""
    add_fleet_arguments(parser)
    parser.add_argument("--nproc-per-node", metavar="P", type=positive_int,
                        help="ranks per host (default: 1; one Mac, one rank); with --local N: this machine as N "
                             "nodes of P ranks each" + (" (as the job was launched)" if joining else ""))
    if joining:
        parser.add_argument("--min-nodes", metavar="K", type=positive_int,
                            help="the job's --min-nodes: the joiners decide who is in with the others")
        parser.add_argument("--leave-on-login", action="store_true",
                            help="a joining rank leaves the job when someone logs in at its Mac's screen (macOS)")
    else:
        parser.add_argument("--max-restarts", metavar="N", type=non_negative_int, default=0,
                            help="when a rank fails, stop all ranks and start them all again, up to N times "
                                 "(default: 0); ranks see MCCL_RESTART_COUNT")
        parser.add_argument("--elastic", action="store_true",
                            help="the job goes on when a rank exits (a program using lightning_mccl.elastic); the "
                                 "exit code is rank 0's")
        parser.add_argument("--min-nodes", metavar="K", type=positive_int,
                            help="with --elastic: end the job when fewer than K nodes remain (with --local N, K "
                                 "ranks); default: go on while host 0 remains")
        parser.add_argument("--leave-on-login", action="store_true",
                            help="with --elastic: a rank leaves the job when someone logs in at its Mac's screen "
                                 "(macOS; the others go on), so that the Mac is its owner's again")
    parser.add_argument("--caffeinate", action=argparse.BooleanOptionalAction, default=None,
                        help="keep each host awake while its ranks run (`caffeinate -ims`); default: on for "
                             "macOS hosts, off elsewhere")
    parser.add_argument("--progress-every", metavar="S", type=seconds, default=PROGRESS_EVERY_S,
                        help="when stdout is not a terminal (a log): rank 0's progress bar as a line at most every S "
                             "seconds (default: %(default)g; on a terminal it is drawn in place)")
    parser.add_argument("--port-range", metavar="LOW-HIGH", type=port_range,
                        help="the only ports ranks listen on while connecting (sets MCCL_PORT_RANGE; "
                             "e.g. 29600-29700), so a firewall can allow them; default: any free port")
    parser.add_argument("--env", metavar="NAME[=VALUE]", action="append", default=[],
                        help="set NAME for every rank; repeatable. NAME alone takes the value from the launcher's "
                             "environment and keeps it off the command line, where `ps` shows NAME=VALUE to "
                             "every user of this machine: use it for secrets")
    if joining:
        parser.add_argument("host", metavar="HOST", nargs="?",
                            help="the host of the hostfile whose ranks join (none with --local)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command every rank runs, after --" + (" (the job's)" if joining else ""))


def fleet_source(args: argparse.Namespace) -> str:
    """Where the hosts come from, for messages: the hostfile's path, --local N or --switch TAG."""
    if args.hostfile is not None:
        return args.hostfile
    return f"--local {args.local}" if args.local is not None else f"--switch {args.switch}"


def command_plan(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]],
                 example: str):
    """(the plan of `mccl launch` or `mccl join`'s options and command, whether `python` was replaced); bad input
    exits through parser.error."""
    if command is not None and args.command:
        parser.error("give the command once, after --")
    command = list(command if command is not None else args.command)
    if not command:
        parser.error(f"missing the command to run, e.g. {example} -- python train.py")
    try:
        env = parse_env(args.env)
        if args.port_range:
            env["MCCL_PORT_RANGE"] = args.port_range
        command, replaced = resolve_command(command, args.python)
        plan = plan_from_args(args, command, nproc_per_node=args.nproc_per_node, env=env)
    except (LaunchError, HostfileError) as e:
        parser.error(str(e))
    caffeinate = {None: "auto", True: "on", False: "off"}[args.caffeinate]
    return replace(plan, caffeinate=caffeinate), replaced


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]]) -> int:
    """`mccl launch`: returns the exit code (parser.error exits 2 on bad input)."""
    if args.min_nodes is not None and not args.elastic:
        parser.error(f"--min-nodes {args.min_nodes} needs --elastic (without it, the first rank to exit ends the job)")
    if args.leave_on_login and not args.elastic:
        parser.error("--leave-on-login needs --elastic (without it, a rank that leaves ends the job)")
    if args.elastic and args.max_restarts:
        parser.error("--max-restarts restarts every rank after a failure, --elastic goes on without the failed one: "
                     "give one of them")
    plan, replaced = command_plan(args, parser, command, "mccl launch --local 2")
    if args.elastic:
        try:
            plan = elastic_plan(plan, args.min_nodes, fleet_source(args))
        except LaunchError as e:
            parser.error(str(e))
    plan = replace(plan, max_restarts=args.max_restarts, leave_on_login=args.leave_on_login)
    log = make_log(stderr_console())
    warn_secret_values(args.env, log)
    log(f"launching {plan.describe()}{' (elastic)' if plan.elastic else ''}: {shlex.join(plan.command)}")
    if replaced:
        log(f"`python` runs as {plan.python} (see --python)")
    result = run_job(plan, log=log, fresh_port=args.local is not None and args.master_port is None,
                     progress_every=args.progress_every)
    if result.summary:
        print(result.summary, flush=True)
    return result.outcome.returncode


def run_join(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]]) -> int:
    """`mccl join`: returns the exit code of the joining ranks (parser.error exits 2 on bad input)."""
    if args.local is not None and args.master_port is None:
        parser.error("--local needs --master-port: the running job's port (its launcher's first line says "
                     "master 127.0.0.1:PORT)")
    plan, replaced = command_plan(args, parser, command, "mccl join --hostfile fleet.yaml HOST")
    try:
        plan = join_plan(plan, args.host, args.min_nodes, fleet_source(args))
    except LaunchError as e:
        parser.error(str(e))
    plan = replace(plan, leave_on_login=args.leave_on_login)
    log = make_log(stderr_console())
    warn_secret_values(args.env, log)
    ranks = len(plan.rank_specs())
    log(f"joining {ranks} rank{'s' if ranks != 1 else ''} of {plan.joining} to the elastic job at "
        f"{plan.master_addr}:{plan.master_port}: {shlex.join(plan.command)}")
    if replaced:
        log(f"`python` runs as {plan.python} (see --python)")
    result = run_job(plan, log=log, progress_every=args.progress_every)
    return result.outcome.returncode


def add_leave_arguments(parser: argparse.ArgumentParser) -> None:
    """`mccl leave`'s options: where the job's Store is, and whom to ask."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--hostfile", metavar="FILE", help="the job's hostfile: its host 0 serves the Store")
    where.add_argument("--master", metavar="ADDR:PORT", type=address_port,
                       help="the job's Store: host 0's address and the job's port (a --local job's launcher says "
                            "master 127.0.0.1:PORT)")
    parser.add_argument("--master-port", metavar="PORT", type=port,
                        help="with --hostfile: the job's port (default: the hostfile's master_port)")
    parser.add_argument("--nproc-per-node", metavar="P", type=positive_int,
                        help="with --hostfile: the job's ranks per host (default: 1)")
    parser.add_argument("--timeout", metavar="S", type=positive_seconds, default=LEAVE_TIMEOUT_S,
                        help="how long to try to reach the Store (default: %(default)g s)")
    parser.add_argument("who", metavar="HOST|MEMBER", help="a host of the hostfile, or a member id (m2, j1)")


def run_leave(args: argparse.Namespace, parser: argparse.ArgumentParser, command) -> int:
    """`mccl leave`: returns the exit code (parser.error exits 2 on bad input)."""
    if command is not None:
        parser.error("mccl leave takes no command")
    if args.master is not None and (args.master_port is not None or args.nproc_per_node is not None):
        parser.error("--master-port and --nproc-per-node go with --hostfile (--master gives the port)")
    try:
        if args.hostfile is not None:
            plan = fleet_plan((), hostfile=args.hostfile, nproc_per_node=args.nproc_per_node,
                              master_port=args.master_port)
            (addr, job_port), source = (plan.master_addr, plan.master_port), args.hostfile
        else:
            plan, (addr, job_port), source = None, args.master, None
        members = leave_targets(plan, args.who, source)
    except (LaunchError, HostfileError) as e:
        parser.error(str(e))
    log = make_log(stderr_console())
    try:
        ask_to_leave(addr, job_port, members, timeout=args.timeout)
    except LeaveError as e:
        log(str(e))
        return 1
    named = "" if members == [args.who] else f" ({args.who})"
    log(f"asked {', '.join(members)}{named} to leave the job at {addr}:{job_port}: "
        f"{'it leaves' if len(members) == 1 else 'they leave'} at the next step boundary")
    return 0
