"""`mccl join`: one host's ranks join a running elastic job (`mccl launch --elastic`).

    mccl join --hostfile fleet.yaml studio-03 -- python train.py     # the job's command
    mccl join --local 1 --master-port 29511 -- python train.py       # a rank of this machine, to a --local job

The ranks start as `mccl launch` would start that host's (over ssh, in the working directory, with the same
environment: give the options the job was launched with: --nproc-per-node, --master-port, --env, --min-nodes),
plus MCCL_ELASTIC=1 and MCCL_ELASTIC_JOIN=1, which makes ``ElasticManager.from_env`` register them as joiners at
the job's Store on host 0 (MASTER_ADDR:MASTER_PORT): the members admit them at a step boundary and send them the
training state. Host 0 cannot join (it serves the Store). With ``--local N`` the job is one on this machine
(its port: the launcher's first line says ``master 127.0.0.1:PORT``). Output and exit code as `mccl launch`'s.
"""
from __future__ import annotations

import argparse
import shlex
from typing import Optional, Sequence

from ..launcher import LaunchError, run_job, warn_secret_values
from ..launcher.elastic import join_plan
from .console import make_log, stderr_console
from .launch import add_arguments as add_launch_arguments
from .launch import command_plan, fleet_source

EPILOG = """\
the ranks get what mccl launch gives that host's ranks, plus MCCL_ELASTIC=1 and MCCL_ELASTIC_JOIN=1
(ElasticManager.from_env then joins the running job at MASTER_ADDR:MASTER_PORT); give the job's own options
(--master-port, --nproc-per-node, --env, --min-nodes) and its command after --. Host 0 cannot join.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_arguments(parser, joining=True)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]]) -> int:
    """`mccl join`: returns the exit code of the joining ranks (parser.error exits 2 on bad input)."""
    if args.local is not None and args.master_port is None:
        parser.error("--local needs --master-port: the running job's port (its launcher's first line says "
                     "master 127.0.0.1:PORT)")
    plan, replaced = command_plan(args, parser, command, "mccl join --hostfile fleet.yaml HOST")
    try:
        plan = join_plan(plan, args.host, args.min_nodes, fleet_source(args))
    except LaunchError as e:
        parser.error(str(e))
    log = make_log(stderr_console())
    warn_secret_values(args.env, log)
    ranks = len(plan.rank_specs())
    log(f"joining {ranks} rank{'s' if ranks != 1 else ''} of {plan.joining} to the elastic job at "
        f"{plan.master_addr}:{plan.master_port}: {shlex.join(plan.command)}")
    if replaced:
        log(f"`python` runs as {plan.python} (see --python)")
    result = run_job(plan, log=log, progress_every=args.progress_every)
    return result.outcome.returncode


__all__ = ["add_arguments", "run", "EPILOG"]
