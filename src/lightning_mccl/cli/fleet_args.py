"""The options `mccl launch` and `mccl doctor` share (which hosts, how to reach them), their argparse
types, and the `LaunchPlan` the parsed options describe."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Mapping, Optional, Sequence

from ..hostfile import check_addresses, load_hostfile
from .launch_plan import (DEFAULT_GRACE_S, DEFAULT_SSH, LaunchError, LaunchPlan, hostfile_plan, local_plan,
                          switch_plan)


def _int_at_least(minimum: int):
    """An argparse type: an integer >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def _number_of_seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None


def _seconds(text: str) -> float:
    """An argparse type: seconds, 0 or more."""
    value = _number_of_seconds(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    """An argparse type: seconds, more than 0 (a limit of 0 would end the run at once)."""
    value = _number_of_seconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _port_range(text: str) -> str:
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = 0
    if not sep or not 1 <= lo <= hi <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port range LOW-HIGH (1 <= LOW <= HIGH <= 65535), "
                                         "e.g. 29600-29700")
    return f"{lo}-{hi}"


def add_fleet_arguments(parser: argparse.ArgumentParser, runs_command: bool = True) -> None:
    """The options `mccl launch` and `mccl doctor` share: which hosts, and how to reach them (doctor, which
    takes no command: `runs_command=False`, --grace hidden)."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--hostfile", metavar="FILE", help="fleet hostfile (YAML or JSON): the hosts, reached by ssh")
    where.add_argument("--local", metavar="N", type=_positive_int,
                       help="N ranks on this machine over loopback, no ssh: one node, LOCAL_RANK 0..N-1 (as torchrun "
                            "--nproc-per-node N), or with --nproc-per-node P, N nodes of P ranks each" if runs_command
                       else "N hosts that are this machine, over loopback (no ssh)")
    where.add_argument("--switch", metavar="TAG",
                       help="the hosts of the emulated switch TAG on this machine (`mccl switch up`; root)")
    parser.add_argument("--master-port", metavar="PORT", type=_port,
                        help="rendezvous port on host 0 (default: the hostfile's master_port; a free port with --local)")
    parser.add_argument("--chdir", metavar="DIR", help="working directory of every rank (default: this one)")
    parser.add_argument("--python", metavar="PY", default=sys.executable,
                        help=("Python on the hosts, also for a command starting with `python`" if runs_command else
                              "Python on the hosts (the one the ranks will use)") + " (default: %(default)s)")
    parser.add_argument("--ssh", metavar="CMD", default=DEFAULT_SSH,
                        help="ssh command and options (default: %(default)r); -T is always added")
    parser.add_argument("--grace", metavar="S", type=_seconds, default=DEFAULT_GRACE_S,
                        help="seconds ranks get to exit after being asked to stop, before they are killed "
                             "(default: %(default)g)" if runs_command else argparse.SUPPRESS)


def plan_from_args(args: argparse.Namespace, command: Sequence[str], *, nproc_per_node: Optional[int] = None,
                   env: Optional[Mapping[str, str]] = None) -> LaunchPlan:
    """The plan for parsed `mccl launch`/`mccl doctor` options; `nproc_per_node`: ranks per host (None: 1 per
    host, and ``--local N`` is one node of N ranks). Raises LaunchError (or HostfileError, also for
    a host whose addr is not an IP address or a name that resolves: `hostfile.check_addresses`)."""
    cwd = os.path.abspath(args.chdir) if args.chdir else os.getcwd()
    common = dict(nproc_per_node=nproc_per_node or 1, python=args.python, cwd=cwd, env=dict(env or {}),
                  grace=args.grace, master_port=args.master_port)
    if args.local is not None or getattr(args, "switch", None) is not None:
        if not os.path.isdir(cwd):
            raise LaunchError(f"--chdir {args.chdir}: no such directory")
        if args.local is not None:  # --local N: one node of N ranks; with --nproc-per-node P: N nodes of P
            nodes = 1 if nproc_per_node is None else args.local
            return local_plan(nodes, command, **{**common, "nproc_per_node": nproc_per_node or args.local})
        from ..switch import SwitchError, SwitchFleet

        try:
            return switch_plan(SwitchFleet.attach(args.switch), command, **common)
        except (SwitchError, ValueError) as e:
            raise LaunchError(f"--switch {args.switch}: {e}") from None
    try:
        ssh = shlex.split(args.ssh)
    except ValueError as e:
        raise LaunchError(f"--ssh {args.ssh!r}: {e}") from None
    hostfile = load_hostfile(args.hostfile)
    check_addresses(hostfile)
    return hostfile_plan(hostfile, command, ssh=ssh, **common)
