"""The `mccl` command.

    mccl launch --hostfile fleet.yaml -- python train.py fit --config vit.yaml
    mccl launch --local 2 -- python train.py fit --config vit.yaml
    mccl launch --hostfile fleet.yaml --elastic --min-nodes 2 -- python train.py  # goes on when a Mac leaves
    mccl leave --hostfile fleet.yaml studio-03                                    # ask a Mac to leave that job
    mccl join --hostfile fleet.yaml studio-03 -- python train.py                  # start it again, as a joiner
    mccl doctor --hostfile fleet.yaml          # or --local 2
    mccl switch up --hosts 4 --rate 1gbit      # an emulated fleet on this Linux machine (root)

`launch` runs a command on every rank of the fleet (see `lightning_mccl.cli.launch`); `leave` asks a host to leave
a running elastic job and `join` starts one as a joiner of it (both in `lightning_mccl.cli.launch`); `doctor`
checks the fleet and measures its links with the mccl engine (see `lightning_mccl.cli.doctor`); `switch` builds an
emulated fleet (see `lightning_mccl.cli.switch`); `plan` predicts a fleet's training step. These modules are
thin front ends: argument parsing (their shared types: `arg_types`, `fleet_args`) and printing (`console`);
the launcher itself is the library `lightning_mccl.launcher`. Nothing outside this package imports it, but
for `main` (the `mccl` script and ``python -m lightning_mccl.cli``).
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

__all__ = ["main", "build_parser"]


def _subcommands():
    """The registration table: each subcommand's name, its texts for --help, and its front end's
    `add_arguments(parser)` and `run(args, parser, command)`."""
    from . import doctor, launch, plan, switch

    return [
        dict(name="launch", add=launch.add_arguments, run=launch.run, epilog=launch.EPILOG,
             help="run a command on every rank (one process per host, over ssh; or --local N)",
             description="Run COMMAND as every rank of the fleet, with torchrun's environment variables.",
             usage="mccl launch (--hostfile FILE | --local N | --switch TAG) [options] -- COMMAND ..."),
        dict(name="leave", add=launch.add_leave_arguments, run=launch.run_leave, epilog=launch.LEAVE_EPILOG,
             help="ask a host (or a member) of a running elastic job to leave it",
             description="Ask the members a host runs (or one member) to leave a running elastic job (mccl launch "
                         "--elastic) at their next step boundary, through the job's Store on host 0.",
             usage="mccl leave (--hostfile FILE | --master ADDR:PORT) [options] HOST|MEMBER"),
        dict(name="join", add=lambda p: launch.add_arguments(p, joining=True), run=launch.run_join,
             epilog=launch.JOIN_EPILOG, help="start a host's ranks as joiners of a running elastic job",
             description="Start HOST's ranks (or, with --local N, N ranks of this machine) as joiners of the running "
                         "elastic job whose host 0 serves the Store, with the job's command.",
             usage="mccl join (--hostfile FILE HOST | --local N --master-port PORT) [options] -- COMMAND ..."),
        dict(name="doctor", add=doctor.add_arguments, run=doctor.run, epilog=doctor.epilog(),
             help="check the hosts, then measure latency and bandwidth between them with mccl",
             description="Check ssh, versions and the master port on every host, then measure every pair of "
                         "hosts (ping-pong latency, one-way bandwidth) and the fleet's allreduce, over mccl."),
        dict(name="switch", add=switch.add_arguments, run=switch.run, epilog=switch.EPILOG,
             help="emulate a fleet on this Linux machine: hosts on a rate-limited switch (root)",
             description="An emulated Ethernet switch: N hosts as network namespaces, links shaped with tc."),
        dict(name="plan", add=plan.add_arguments, run=plan.run, epilog=plan.EPILOG,
             help="predict the training step of 1-48 Macs from this machine's compute profile",
             description="Predict each method's training step (DDP, bf16, int8, PowerSGD, DiLoCo) on fleets of N "
                         "hosts from a compute profile of the model and the link's rate."),
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mccl", description="Run and check PyTorch training across a fleet of Macs (the mccl backend).")
    table = _subcommands()
    sub = parser.add_subparsers(dest="subcommand", metavar="{" + ",".join(c["name"] for c in table) + "}",
                                required=True)
    for c in table:
        p = sub.add_parser(c["name"], help=c["help"], description=c["description"], usage=c.get("usage"),
                           epilog=c["epilog"], formatter_class=argparse.RawDescriptionHelpFormatter)
        c["add"](p)
        p.set_defaults(run=c["run"], subparser=p)
    return parser


def _split_command(argv: List[str]):
    """Everything after the first ``--`` is the command (None: there was no ``--``)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `mccl` script; returns the exit code (2 for bad arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options, command = _split_command(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(options)
        return int(args.run(args, args.subparser, command) or 0)
    except SystemExit as e:  # argparse's errors (2) and --help (0)
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        sys.stderr.write(f"{e.code}\n")
        return 1
    except KeyboardInterrupt:  # before (or between) the supervisor's runs, which handle it themselves
        sys.stderr.write("mccl: interrupted\n")
        return 130
