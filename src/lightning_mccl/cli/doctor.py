"""`mccl doctor`: is the fleet ready to train, and how fast are its links?

    mccl doctor --hostfile fleet.yaml
    mccl doctor --local 2

    mccl doctor --hostfile fleet.yaml --model vit_base_patch16_224 --batch 32   # also each Mac's speed

1. Every host, through the launcher (so over ssh for a hostfile): reachable? Which Python, torch,
   lightning-mccl and lightning (the same everywhere?), and is the master port free on host 0? Then its
   setup (`launcher.host_checks.CHECKS`): addresses and interfaces; on a Mac, the firewall, sleep, the
   display and macOS 26's GPU watchdog, recent panics, power mode, thermal state and GPU load.
2. Then, if every host answered with torch and lightning-mccl installed and the port is free, the
   measurement program `doctor_bench` runs on every host through the launcher (backend "mccl"): a connection
   from every host to every other (a failure named with its likely cause: macOS's Local Network privacy, a
   firewall), ping-pong latency and one-way bandwidth for every pair of hosts, the fleet's allreduce bus
   bandwidth, with --model and --batch each host's samples/s at the model's training step (a Mac below 0.8
   of the median named with its likely causes), and each rank's reduction path (CPU vector instructions,
   MPS in place or staged, Metal kernels or torch ops) with the reason.

Tables go to stdout, progress and problems to stderr. Exit code 0 when every check passed, 1 otherwise
(2 for bad arguments).
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from typing import Optional, Sequence

from rich.markup import escape
from rich.table import Table

from ..hostfile import HostfileError
from ..launcher import LaunchError, LaunchPlan, RankTails, supervise
from ..launcher.doctor_bench import RESULT_MARKER
from ..launcher.doctor_checks import (PROBE_MARKER, PROBE_TIMEOUT_S, VERSIONS, CapturedOutput, HostReport,
                                      bench_command, check_hosts, probe_command, setup_findings)
from ..launcher import host_checks
from ..launcher.doctor_reduction import table as reduction_table
from ..launcher.fleet_checks import check_connections, check_speed, median_rate
from ..launcher.host_checks import FAIL, OK, Finding
from ..tables import stdout_console
from .arg_types import mib, positive_int, positive_seconds
from .console import make_log, stderr_console
from .fleet_args import add_fleet_arguments, plan_from_args

# A link slower than this fraction of the fleet's median bandwidth is marked "slow".
SLOW_FRACTION = 0.5


def epilog() -> str:
    """`mccl doctor --help`'s list of the host checks, from their declaration (host_checks.CHECKS): the setup
    checks, then those of the measurement, each by the hosts it applies to."""
    checks = host_checks.CHECKS
    width = max(len(c.name) for c in checks)
    lines = []
    for stage, title in ((host_checks.SETUP, "host setup checks, the Host setup table (docs/macs.md, step 6):"),
                         (host_checks.MEASURED, "checks of the measurement:")):
        lines.append(title)
        ours = [c for c in checks if c.stage == stage]
        for hosts in dict.fromkeys(c.hosts for c in ours):
            lines.append(f"  {hosts}:" if hosts == host_checks.EVERY else f"  {hosts} hosts also:")
            lines += [f"    {c.name:<{width}}  {c.about}" for c in ours if c.hosts == hosts]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fleet_arguments(parser, runs_command=False)
    parser.add_argument("--size-mib", metavar="MIB", type=mib, default=16.0,
                        help="message size for bandwidth and allreduce (default: %(default)g MiB)")
    parser.add_argument("--iters", metavar="N", type=positive_int, default=5,
                        help="timed repetitions of each bandwidth/allreduce measurement (default: %(default)d)")
    parser.add_argument("--latency-iters", metavar="N", type=positive_int, default=50,
                        help="timed round trips per pair (default: %(default)d)")
    parser.add_argument("--timeout", metavar="S", type=positive_seconds, default=180.0,
                        help="limit for the measurement run, seconds (default: %(default)g)")
    parser.add_argument("--verbose", action="store_true", help="show the hosts' output (prefixed, on stderr)")
    speed = parser.add_argument_group("each host's speed (optional)")
    speed.add_argument("--model", help="time this model's training step on every host, on the device its ranks use "
                                       "(a timm name or module:Class, as mccl plan takes)")
    speed.add_argument("--batch", metavar="B", type=positive_int, help="samples per step for --model")
    speed.add_argument("--steps", metavar="N", type=positive_int, default=5,
                       help="timed steps for --model, after 2 untimed (default: %(default)d)")


def hosts_table(reports: Sequence[HostReport], port: int) -> Table:
    table = Table(title="Hosts", title_justify="left")
    for col in ("node", "host", "addr", "reached", *(title for _, title in VERSIONS), f"port {port}"):
        table.add_column(col)
    answered = [r for r in reports if r.info is not None]
    common = {key: statistics.mode([r.info.get(key) for r in answered]) if answered else None for key, _ in VERSIONS}
    for r in reports:
        if r.info is None:
            table.add_row(str(r.node_rank), escape(r.name), r.addr, f"[red]no (exit {r.returncode})[/]", *[""] * (len(VERSIONS) + 1))
            continue
        cells = []
        for key, _ in VERSIONS:
            v = r.info.get(key)
            cells.append(f"[red]{escape(v or 'missing')}[/]" if v != common[key] or not v else escape(v))
        if r.node_rank == 0:
            port_cell = "[red]in use[/]" if r.info.get("port_error") else "free"
        else:
            port_cell = ""
        table.add_row(str(r.node_rank), escape(r.name), r.addr, "yes", *cells, port_cell)
    return table


def setup_table(findings: Sequence[Finding], title: str = "Host setup") -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("host", "check", "state", "detail", "fix"):
        table.add_column(col)
    colour = {OK: "green", FAIL: "red"}
    for f in findings:
        table.add_row(escape(f.host), f.check, f"[{colour.get(f.state, 'yellow')}]{f.state}[/]", escape(f.detail),
                      escape(f.fix or ""))
    return table


def links_table(result: dict, plan: LaunchPlan) -> Table:
    table = Table(title="Links (mccl send/recv)", title_justify="left")
    for col, justify in (("pair", "left"), ("hosts", "left"), ("latency µs", "right"), ("a→b Gbit/s", "right"),
                         ("b→a Gbit/s", "right"), ("note", "left")):
        table.add_column(col, justify=justify)
    bws = [bw for p in result["pairs"] for bw in (p["bandwidth_ab"], p["bandwidth_ba"])]
    median_bw = statistics.median(bws) if bws else 0.0
    for p in result["pairs"]:
        a, b = p["a"], p["b"]
        slow = len(result["pairs"]) >= 3 and min(p["bandwidth_ab"], p["bandwidth_ba"]) < SLOW_FRACTION * median_bw
        table.add_row(f"({a}, {b})", escape(f"{plan.hosts[a].name} ↔ {plan.hosts[b].name}"), f"{p['latency_s'] * 1e6:.1f}",
                      f"{p['bandwidth_ab'] * 8 / 1e9:.3f}", f"{p['bandwidth_ba'] * 8 / 1e9:.3f}",
                      "[red]slow[/]" if slow else "")
    return table


def allreduce_table(result: dict) -> Table:
    ar = result["allreduce"]
    table = Table(title="Allreduce (mccl, float32 sum)", title_justify="left")
    for col in ("ranks", "size", "time ms", "algbw Gbit/s", "busbw Gbit/s"):
        table.add_column(col, justify="right")
    table.add_row(str(result["world_size"]), _size(ar["size_bytes"]), f"{ar['seconds'] * 1e3:.2f}",
                  f"{ar['algbw'] * 8 / 1e9:.3f}", f"{ar['busbw'] * 8 / 1e9:.3f}")
    return table


def speed_table(speeds: Sequence[dict], findings: Sequence[Finding], plan: LaunchPlan) -> Table:
    """Each rank's samples/s at the model's step; the slow ones' likely causes follow as warnings."""
    table = Table(title="Speed (the model's training step)", title_justify="left")
    for col, justify in (("rank", "right"), ("host", "left"), ("device", "left"), ("step ms", "right"),
                         ("samples/s", "right"), ("of median", "right"), ("state", "left")):
        table.add_column(col, justify=justify)
    median = median_rate(speeds)
    colour = {OK: "green", FAIL: "red"}
    for rank, (s, f) in enumerate(zip(speeds, findings)):
        timed = ("", "", "", "") if "error" in s else (
            escape(s["device_name"]), f"{s['step_s'] * 1e3:.2f}", f"{s['samples_per_s']:.1f}",
            f"{s['samples_per_s'] / median:.2f}")
        table.add_row(str(rank), escape(plan.hosts[rank].name), *timed, f"[{colour.get(f.state, 'yellow')}]{f.state}[/]")
    return table


def _size(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):g} MiB" if nbytes >= (1 << 20) else f"{nbytes / 1024:g} KiB"


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]]) -> int:
    if command:
        parser.error("mccl doctor takes no command")
    if bool(args.model) != bool(args.batch):
        parser.error("--model and --batch go together: the model to time, and its samples per step")
    try:
        probe_plan = plan_from_args(args, probe_command(args.python), nproc_per_node=1)  # one rank a host
    except (LaunchError, HostfileError) as e:
        parser.error(str(e))
    log = make_log(stderr_console(), "mccl doctor")
    out = stdout_console()

    # 1. the hosts
    specs = probe_plan.rank_specs()
    log(f"checking {len(probe_plan.hosts)} host{'s' if len(probe_plan.hosts) != 1 else ''} "
        f"({'this machine' if probe_plan.is_local else 'over ssh'}) with {probe_plan.python}")
    captured = CapturedOutput(specs, echo=args.verbose)
    outcome = supervise(probe_plan, log=log, output=captured, fail_fast=False, timeout=PROBE_TIMEOUT_S)
    if outcome.signal is not None:  # Ctrl-C: the Supervisor said so, in one line; what the hosts said is moot
        return 128 + outcome.signal
    codes = {e.spec.rank: e.returncode for e in outcome.exits}
    reports = [HostReport(i, h.name, h.addr, codes.get(i), captured.marked(i, PROBE_MARKER), captured.tail(i))
               for i, h in enumerate(probe_plan.hosts)]
    out.print(hosts_table(reports, probe_plan.master_port))
    findings = setup_findings(reports)
    if findings:
        out.print(setup_table(findings))
    problems = check_hosts(reports)
    for f in findings:
        if f.state != OK:
            line = f"{f.host}: {f.check}: {f.detail}" + (f"; fix: {f.fix}" if f.fix else "")
            (problems.append(line) if f.state == FAIL else log(f"[warning] {line}"))
    blocking = [r for r in reports if r.info is None or not r.info.get("torch") or not r.info.get("lightning_mccl")]
    blocking += [f for f in findings if f.state == FAIL]
    port_busy = reports[0].info is not None and reports[0].info.get("port_error")
    for p in problems:
        log(f"[problem] {p}")
    if blocking or port_busy:
        log("not measuring the links until the problems above are fixed")
        return 1
    if not problems:
        log("every host answered, with the same versions")
    if probe_plan.world_size < 2:
        log("one host: no links to measure")
        return 1 if problems else 0

    # 2. the links
    bench = bench_command(probe_plan.python, size_mib=args.size_mib, iters=args.iters,
                          latency_iters=args.latency_iters, pg_timeout=max(10.0, args.timeout - 10.0),
                          model=args.model, batch=args.batch or 0, steps=args.steps)
    bench_plan = replace(probe_plan, command=tuple(bench))
    log(f"measuring over mccl: {bench_plan.describe()}")
    specs = bench_plan.rank_specs()
    captured = CapturedOutput(specs, echo=args.verbose)
    tails = RankTails(captured)  # each rank's first error, and a known cause (the GPU watchdog) named anywhere
    outcome = supervise(bench_plan, log=log, output=tails, fail_fast=True, timeout=args.timeout)
    if outcome.signal is not None:  # Ctrl-C (also while the ranks stopped after a failure): one line, above
        return 128 + outcome.signal
    hosts = [h.name for h in bench_plan.hosts]
    setups = [r.info.get("setup") if r.info else None for r in reports]
    unreachable = captured.unreachable()
    if unreachable:
        found = check_connections(hosts, setups, unreachable)
        out.print(setup_table(found, "Connections (from the ranks' Python, before the measurement)"))
        for f in found:
            log(f"[problem] {f.host}: {f.check}: {f.detail}; fix: {f.fix}")
        return 1
    result = captured.marked(0, RESULT_MARKER) if outcome.returncode == 0 else None
    if result is None:
        rank = outcome.failed.spec.rank if outcome.failed is not None else 0
        error, cause = tails.first_error(rank), tails.named_cause(rank)
        log(f"the measurement failed ({outcome.reason}, exit code {outcome.returncode})"
            + (f": rank {rank} ({hosts[rank]}): {error}" if error else "") + (f". The cause: {cause}" if cause else "")
            + f"; the last output of rank {rank} ({hosts[rank]}):")
        for text in captured.tail(rank, 25):
            log(f"    {text}")
        return 1
    if result["pairs"]:
        out.print(links_table(result, bench_plan))
        out.print(f"[dim]latency: half the median round trip of 4 bytes ({args.latency_iters} round trips); "
                  f"bandwidth: {_size(result['size_bytes'])} one way, median of {args.iters}[/]")
    if result["allreduce"]:
        out.print(allreduce_table(result))
        out.print("[dim]busbw = algbw × 2(n-1)/n, the slowest rank's median time[/]")
    if result.get("speed"):
        found = check_speed(hosts, setups, result["speed"])
        out.print(speed_table(result["speed"], found, bench_plan))
        for f in found:
            if f.state != OK:
                log(f"[warning] {f.host}: {f.check}: {f.detail}" + (f"; fix: {f.fix}" if f.fix else ""))
    if result.get("reduction"):
        out.print(reduction_table(result["reduction"]))
    if problems:
        log(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found (see above)")
        return 1
    log("all checks passed")
    return 0
