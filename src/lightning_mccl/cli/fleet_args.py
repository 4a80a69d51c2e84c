"""The options `mccl launch` and `mccl doctor` share (which hosts, how to reach them), and the `LaunchPlan`
(`lightning_mccl.launcher.fleet_plan`) the parsed options describe."""
from __future__ import annotations

import argparse
import sys
from typing import Mapping, Optional, Sequence

from ..launcher import DEFAULT_GRACE_S, DEFAULT_SSH, LaunchPlan, fleet_plan
from .arg_types import port, positive_int, seconds


def add_fleet_arguments(parser: argparse.ArgumentParser, runs_command: bool = True) -> None:
    """The options `mccl launch` and `mccl doctor` share: which hosts, and how to reach them (doctor, which
    takes no command: `runs_command=False`, --grace hidden)."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--hostfile", metavar="FILE", help="fleet hostfile (YAML or JSON): the hosts, reached by ssh")
    where.add_argument("--local", metavar="N", type=positive_int,
                       help="N ranks on this machine over loopback, no ssh: one node, LOCAL_RANK 0..N-1 (as torchrun "
                            "--nproc-per-node N), or with --nproc-per-node P, N nodes of P ranks each" if runs_command
                       else "N hosts that are this machine, over loopback (no ssh)")
    where.add_argument("--switch", metavar="TAG",
                       help="the hosts of the emulated switch TAG on this machine (`mccl switch up`; root)")
    parser.add_argument("--master-port", metavar="PORT", type=port,
                        help="rendezvous port on host 0 (default: the hostfile's master_port; a free port with --local)")
    parser.add_argument("--chdir", metavar="DIR", help="working directory of every rank (default: this one)")
    parser.add_argument("--python", metavar="PY", default=sys.executable,
                        help=("Python on the hosts, also for a command starting with `python`" if runs_command else
                              "Python on the hosts (the one the ranks will use)") + " (default: %(default)s)")
    parser.add_argument("--ssh", metavar="CMD", default=DEFAULT_SSH,
                        help="ssh command and options (default: %(default)r); -T is always added")
    parser.add_argument("--grace", metavar="S", type=seconds, default=DEFAULT_GRACE_S,
                        help="seconds ranks get to exit after being asked to stop, before they are killed "
                             "(default: %(default)g)" if runs_command else argparse.SUPPRESS)


def plan_from_args(args: argparse.Namespace, command: Sequence[str], *, nproc_per_node: Optional[int] = None,
                   env: Optional[Mapping[str, str]] = None) -> LaunchPlan:
    """`fleet_plan` for parsed `mccl launch`/`mccl doctor` options (raises what it raises)."""
    return fleet_plan(command, local=args.local, switch=args.switch, hostfile=args.hostfile,
                      nproc_per_node=nproc_per_node, ssh=args.ssh, python=args.python, chdir=args.chdir,
                      master_port=args.master_port, grace=args.grace, env=env)
