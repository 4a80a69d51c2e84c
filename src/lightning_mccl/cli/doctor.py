"""`mccl doctor`: is the fleet ready to train, and how fast are its links?

    mccl doctor --hostfile fleet.yaml
    mccl doctor --local 2

1. Every host, through the launcher (so over ssh for a hostfile): reachable? Which Python, torch,
   lightning-mccl and lightning (the same everywhere?), and is the master port free on host 0?
2. Then, if every host answered with torch and lightning-mccl installed and the port is free, the
   measurement program `doctor_bench` runs on every host through the launcher (backend "mccl"): ping-pong
   latency and one-way bandwidth for every pair of hosts, the fleet's allreduce bus bandwidth, and each
   rank's reduction path (CPU vector instructions, MPS in place or staged) with the reason.

Tables go to stdout, progress and problems to stderr. Exit code 0 when every check passed, 1 otherwise
(2 for bad arguments).
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

from rich.markup import escape
from rich.table import Table

from pathlib import Path

from ..hostfile import HostfileError
from . import host_probe
from .host_checks import FAIL, OK, Finding, judge, path_fix
from . import doctor_reduction
from .console import make_log, stderr_console, stdout_console
from .doctor_bench import RESULT_MARKER
from .error_line import first_error
from .fleet_args import _positive_int, _positive_seconds, add_fleet_arguments, plan_from_args
from .launch import supervise
from .launch_plan import LaunchError, LaunchPlan
from .prefixed_output import PrefixedOutput
from .rank_process import RankSpec

PROBE_MARKER = "MCCL_DOCTOR_PROBE "
PROBE_TIMEOUT_S = 60.0
# What the probe reports, in the order the hosts table shows it (key, column title).
VERSIONS = (("python", "python"), ("torch", "torch"), ("lightning_mccl", "lightning-mccl"), ("lightning", "lightning"))
# A link slower than this fraction of the fleet's median bandwidth is marked "slow".
SLOW_FRACTION = 0.5

# Runs on every host with the Python the ranks use (standard library only, no torch import: fast), after
# host_probe's source (its `collect`: the setup that host_checks judges).
PROBE_SOURCE = Path(host_probe.__file__).read_text() + r"""
import json, os, platform, socket, sys
from importlib import metadata

def version(name):
    try:
        return metadata.version(name)
    except Exception:
        return None

port_error = None
if os.environ.get("NODE_RANK") == "0":  # the rendezvous host
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", int(os.environ["MASTER_PORT"])))
    except OSError as e:
        port_error = e.strerror or str(e)
    finally:
        s.close()
print("MCCL_DOCTOR_PROBE " + json.dumps({
    "hostname": socket.gethostname(), "python": platform.python_version(), "executable": sys.executable,
    "platform": platform.platform(), "torch": version("torch"), "lightning_mccl": version("lightning-mccl"),
    "lightning": version("lightning"), "port_error": port_error, "setup": collect()}), flush=True)
"""


class CapturedOutput:
    """Keeps every rank's lines (and echoes them to stderr, prefixed, when `echo`)."""

    def __init__(self, specs: Sequence[RankSpec], echo: bool = False):
        import sys

        self.lines: Dict[int, List[str]] = defaultdict(list)
        self._echo = PrefixedOutput(specs, stream=sys.stderr) if echo else None

    def line(self, spec: RankSpec, text: str) -> None:
        self.lines[spec.rank].append(text)
        if self._echo is not None:
            self._echo.line(spec, text)

    def flush(self) -> None:
        if self._echo is not None:
            self._echo.flush()

    def marked(self, rank: int, marker: str) -> Optional[dict]:
        for text in reversed(self.lines.get(rank, [])):
            if text.startswith(marker):
                try:
                    return json.loads(text[len(marker):])
                except ValueError:
                    return None
        return None

    def tail(self, rank: int, n: int = 15) -> List[str]:
        return [t for t in self.lines.get(rank, []) if not t.startswith((PROBE_MARKER, RESULT_MARKER))][-n:]


@dataclass
class HostReport:
    node_rank: int
    name: str
    addr: str
    returncode: Optional[int]
    info: Optional[dict]
    output: List[str]


def _mib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    if not value * (1 << 20) >= 4:
        raise argparse.ArgumentTypeError(f"must be at least 4 bytes, got {text} MiB")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fleet_arguments(parser, runs_command=False)
    parser.add_argument("--size-mib", metavar="MIB", type=_mib, default=16.0,
                        help="message size for bandwidth and allreduce (default: %(default)g MiB)")
    parser.add_argument("--iters", metavar="N", type=_positive_int, default=5,
                        help="timed repetitions of each bandwidth/allreduce measurement (default: %(default)d)")
    parser.add_argument("--latency-iters", metavar="N", type=_positive_int, default=50,
                        help="timed round trips per pair (default: %(default)d)")
    parser.add_argument("--timeout", metavar="S", type=_positive_seconds, default=180.0,
                        help="limit for the measurement run, seconds (default: %(default)g)")
    parser.add_argument("--verbose", action="store_true", help="show the hosts' output (prefixed, on stderr)")


def check_hosts(reports: Sequence[HostReport]) -> List[str]:
    """Problems found by the probes: unreachable hosts, missing packages, differing versions, a busy port."""
    problems = []
    for r in reports:
        if r.info is None:
            last = next((t for t in reversed(r.output) if t.strip()), "no output")
            fix = path_fix(r.output)
            problems.append(f"{r.name}: no answer (exit code {r.returncode}): {last}" + (f"; fix: {fix}" if fix else ""))
            continue
        for key in ("torch", "lightning_mccl"):
            if not r.info.get(key):
                problems.append(f"{r.name}: {key.replace('_', '-')} is not installed for {r.info.get('executable')}")
        if r.node_rank == 0 and r.info.get("port_error"):
            problems.append(f"{r.name}: the master port cannot be bound ({r.info['port_error']}); "
                            "is another run still going? Use --master-port")
    answered = [r for r in reports if r.info is not None]
    for key, title in VERSIONS:
        seen = defaultdict(list)
        for r in answered:
            seen[r.info.get(key)].append(r.name)
        if len(seen) > 1:
            detail = "; ".join(f"{v or 'missing'} on {', '.join(hosts)}" for v, hosts in seen.items())
            problems.append(f"different {title} versions: {detail}")
    return problems


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


def setup_findings(reports: Sequence[HostReport]) -> List[Finding]:
    return [f for r in reports if r.info is not None and r.info.get("setup")
            for f in judge(r.name, r.info["setup"], r.addr)]


def setup_table(findings: Sequence[Finding]) -> Table:
    table = Table(title="Host setup", title_justify="left")
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


def _size(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):g} MiB" if nbytes >= (1 << 20) else f"{nbytes / 1024:g} KiB"


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, command: Optional[Sequence[str]]) -> int:
    if command:
        parser.error("mccl doctor takes no command")
    try:
        probe_plan = plan_from_args(args, [args.python, "-c", PROBE_SOURCE], nproc_per_node=1)  # one rank a host
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
    bench = [probe_plan.python, "-m", "lightning_mccl.cli.doctor_bench", "--size-mib", f"{args.size_mib:g}",
             "--iters", str(args.iters), "--latency-iters", str(args.latency_iters),
             "--pg-timeout", f"{max(10.0, args.timeout - 10.0):g}"]
    bench_plan = replace(probe_plan, command=tuple(bench))
    log(f"measuring over mccl: {bench_plan.describe()}")
    specs = bench_plan.rank_specs()
    captured = CapturedOutput(specs, echo=args.verbose)
    outcome = supervise(bench_plan, log=log, output=captured, fail_fast=True, timeout=args.timeout)
    if outcome.signal is not None:  # Ctrl-C (also while the ranks stopped after a failure): one line, above
        return 128 + outcome.signal
    result = captured.marked(0, RESULT_MARKER) if outcome.returncode == 0 else None
    if result is None:
        rank = outcome.failed.spec.rank if outcome.failed is not None else 0
        error = first_error(captured.lines.get(rank, []))
        log(f"the measurement failed ({outcome.reason}, exit code {outcome.returncode})"
            + (f": rank {rank} ({bench_plan.hosts[rank].name}): {error}" if error else "")
            + f"; the last output of rank {rank} ({bench_plan.hosts[rank].name}):")
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
    if result.get("reduction"):
        out.print(doctor_reduction.table(result["reduction"]))
    if problems:
        log(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found (see above)")
        return 1
    log("all checks passed")
    return 0
