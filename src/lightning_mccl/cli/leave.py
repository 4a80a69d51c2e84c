"""`mccl leave`: ask a host of a running elastic job (`mccl launch --elastic`) to leave it.

    mccl leave --hostfile fleet.yaml studio-03          # the members that host's ranks run
    mccl leave --master 127.0.0.1:29511 m2               # a member by its id, e.g. of a --local job

It writes one request per member to the leave log in the job's Store on host 0 (the hostfile's host 0 and its
master_port, or --master-port; or --master ADDR:PORT), and prints one line. Each member leaves at its next step
boundary, after its step is applied everywhere, and exits 0; the members print the change (``m2 left (mccl
leave)``). Members are named as the members' lines name them: ``m<rank>`` for a launched rank, ``j<k>`` for a
joiner; a host of the hostfile names its launched ranks' members (give the job's --nproc-per-node). Host 0's
member serves the Store and is refused. The Store holds nothing secret, so this needs no secret. Exit codes:
0, 1 when the Store cannot be reached within --timeout or holds no such member, 2 for bad input.
"""
from __future__ import annotations

import argparse

from ..hostfile import HostfileError
from ..launcher import LaunchError, fleet_plan
from ..launcher.elastic import LEAVE_TIMEOUT_S, LeaveError, ask_to_leave, leave_targets
from .arg_types import address_port, port, positive_int, positive_seconds
from .console import make_log, stderr_console

EPILOG = """\
the request goes to the leave log in the job's Store (host 0's address and the job's port); each member named
leaves at its next step boundary and exits 0, and the members print the change as one line. Members: m<rank>
(a launched rank), j<k> (a joiner), as the members' lines name them; a HOST of the hostfile: its launched ranks.
exit code: 0; 1 when the Store cannot be reached or holds no such member; 2 for bad input (host 0 must stay).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
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


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, command) -> int:
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


__all__ = ["add_arguments", "run", "EPILOG"]
