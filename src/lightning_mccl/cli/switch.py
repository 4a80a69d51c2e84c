"""`mccl switch`: an emulated Ethernet switch with N hosts, to plan a fleet before buying it (Linux, root).

    mccl switch up --hosts 4 --rate 1gbit        # hosts = network namespaces on a bridge, links shaped with tc
    mccl switch probe                            # TCP goodput host 0 -> host 1 (iperf3, else Python)
    mccl switch exec 2 -- python train.py        # run a command on host 2
    mccl launch --switch fleet -- python train.py   # one rank per emulated host
    mccl switch status
    mccl switch down

See `lightning_mccl.switch.fleet` for what is built. Tables go to stdout, messages to stderr.
"""
from __future__ import annotations

import argparse
import os
from typing import Optional, Sequence

from rich.table import Table

from ..switch import (DEFAULT_CONGESTION, DEFAULT_TAG, SwitchError, SwitchFleet, measure_goodput, privilege_problem,
                      rates)
from ..switch import state as switch_state
from ..tables import stdout_console
from .console import make_log, stderr_console

EPILOG = """\
hosts are Linux network namespaces mccl-TAG-hI with one interface `mccl0` (10.213.K.I+1/24) plugged into
the bridge mc-TAG-br; each link is rate-limited in both directions with tc tbf. Latency is not emulated
(this kernel has no netem). Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="switch_command", metavar="{up,down,status,exec,probe}", required=True)
    p = sub.add_parser("up", help="build the switch and its hosts")
    p.add_argument("--hosts", metavar="N", type=int, required=True, help="number of emulated hosts")
    p.add_argument("--rate", metavar="RATE", default="1gbit", help="link speed, tc style (default: %(default)s)")
    p.add_argument("--burst", metavar="BYTES", help="tbf bucket (default: 80kb at 1gbit, x sqrt(rate/1gbit))")
    p.add_argument("--queue-ms", metavar="MS", type=float, default=10.0,
                   help="queue of each shaped direction, in milliseconds at the rate (default: %(default)g)")
    p.add_argument("--congestion", metavar="NAME", default=DEFAULT_CONGESTION,
                   help="the hosts' TCP congestion control, as a Mac's (cubic) whatever this machine's default; "
                        "'system': this machine's (default: %(default)s)")
    _tag(p)
    p = sub.add_parser("down", help="remove the switch and its hosts (safe to run twice)")
    _tag(p)
    sub.add_parser("status", help="list the switches that are up")
    p = sub.add_parser("exec", help="run a command on one host: mccl switch exec HOST -- COMMAND ...")
    p.add_argument("host", type=int, help="host index (0-based)")
    _tag(p)
    p = sub.add_parser("probe", help="measure TCP goodput between two hosts")
    p.add_argument("--from", dest="a", type=int, default=0, metavar="A", help="sending host (default: 0)")
    p.add_argument("--to", dest="b", type=int, default=1, metavar="B", help="receiving host (default: 1)")
    p.add_argument("--seconds", type=float, default=3.0, help="duration (default: %(default)g)")
    p.add_argument("--tool", choices=("iperf3", "python"), help="default: iperf3 if on PATH, else python")
    _tag(p)


def _tag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tag", default=DEFAULT_TAG, help="which switch (default: %(default)s)")


def hosts_table(fleet: SwitchFleet) -> Table:
    table = Table(title="Emulated hosts", title_justify="left", caption=fleet.describe(), caption_justify="left")
    for col in ("host", "namespace", "address", "interface"):
        table.add_column(col)
    for i in range(fleet.hosts):
        table.add_row(str(i), fleet.netns(i), fleet.host_ip(i), fleet.ifname)
    return table


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]]) -> int:
    log = make_log(stderr_console(), "mccl switch")
    out = stdout_console()
    cmd = args.switch_command
    if cmd != "exec" and command:
        parser.error(f"mccl switch {cmd} takes no command")
    problem = privilege_problem()
    if problem and cmd != "status":
        log(problem)
        return 1
    try:
        if cmd == "up":
            fleet = SwitchFleet(args.hosts, args.rate, tag=args.tag, burst=args.burst, queue_ms=args.queue_ms,
                                congestion=args.congestion)
            fleet.up()
            out.print(hosts_table(fleet))
            log(f"up; run commands on a host with `mccl switch exec HOST{_tag_opt(args.tag)} -- CMD`, "
                f"remove it with `mccl switch down{_tag_opt(args.tag)}`")
            return 0
        if cmd == "down":
            removed = SwitchFleet(1, tag=args.tag).down()
            log(f"removed {len(removed)} namespaces and links" if removed else f"no switch {args.tag!r} was up")
            return 0
        if cmd == "status":
            return _status(out, log)
        fleet = SwitchFleet.attach(args.tag)
        if cmd == "exec":
            _exec(fleet, args.host, command, parser)  # replaces this process
        return _probe(fleet, args, out)  # the one command left: argparse allows no other
    except (SwitchError, ValueError) as e:
        log(str(e))
        return 1


def _exec(fleet: SwitchFleet, host: int, command: Optional[Sequence[str]], parser: argparse.ArgumentParser) -> None:
    """`mccl switch exec`: this process becomes `command` on `host` (parser.error without a command)."""
    if not command:
        parser.error("missing the command after --, e.g. mccl switch exec 0 -- ip addr")
    argv = fleet.exec_argv(host, list(command))
    os.execv(argv[0], argv)


def _probe(fleet: SwitchFleet, args: argparse.Namespace, out) -> int:
    """`mccl switch probe`: the goodput from host args.a to args.b, as a table."""
    r = measure_goodput(fleet, args.a, args.b, args.seconds, tool=args.tool)
    table = Table(title=f"TCP goodput ({r.tool})", title_justify="left", caption=fleet.describe(),
                  caption_justify="left")
    for col in ("from", "to", "Gbit/s", "of rate", "of line rate (0.956 x rate)"):
        table.add_column(col, justify="right")
    table.add_row(str(r.a), str(r.b), f"{r.bits_per_second / 1e9:.3f}", f"{r.fraction_of_rate:.3f}",
                  f"{r.fraction_of_line_rate:.3f}")
    out.print(table)
    return 0


def _tag_opt(tag: str) -> str:
    return "" if tag == DEFAULT_TAG else f" --tag {tag}"


def _status(out, log) -> int:
    records = switch_state.all_records()
    if not records:
        log("no switch is up")
        return 0
    table = Table(title="Emulated switches", title_justify="left")
    for col in ("tag", "hosts", "rate", "burst", "subnet", "created", "state"):
        table.add_column(col)
    for tag, r in records.items():
        fleet = SwitchFleet.attach(tag)
        missing = fleet.health() if privilege_problem() is None else []
        health = "up" if not missing else f"[red]missing {', '.join(missing[:3])}{'...' if len(missing) > 3 else ''}[/]"
        table.add_row(tag, str(r["hosts"]), rates.format_rate(r["rate_bps"]), f"{r['burst_bytes'] // 1000} KB",
                      f"10.213.{r['subnet']}.0/24", r.get("created", ""), health)
    out.print(table)
    return 0
