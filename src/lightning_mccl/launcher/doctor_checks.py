"""What `mccl doctor` runs on every host and reads back: the probe program (versions, the master port,
`host_probe`'s setup), each host's report, and the problems found in them (`host_checks` judges the setup);
then the measurement program (`doctor_bench`), the connections it could not make, and its result (judged by
`fleet_checks`). The tables are the command's own (`lightning_mccl.cli.doctor`)."""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import host_probe
from .doctor_bench import REACH_MARKER, RESULT_MARKER
from .host_checks import Finding, judge, path_fix
from .prefixed_output import PrefixedOutput
from .rank_process import RankSpec

PROBE_MARKER = "MCCL_DOCTOR_PROBE "
PROBE_TIMEOUT_S = 60.0
# What the probe reports, in the order the hosts table shows it (key, column title).
VERSIONS = (("python", "python"), ("torch", "torch"), ("lightning_mccl", "lightning-mccl"), ("lightning", "lightning"))

# Runs on every host with the Python the ranks use (standard library only, no torch import: fast), after
# host_probe's source (its `collect`: the setup that host_checks judges).
PROBE_MAIN = r"""
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


def probe_command(python: str) -> List[str]:
    """The probe as a command for every host: `python -c` host_probe's source and PROBE_MAIN."""
    return [python, "-c", Path(host_probe.__file__).read_text() + PROBE_MAIN]


def bench_command(python: str, *, size_mib: float, iters: int, latency_iters: int, pg_timeout: float,
                  model: Optional[str] = None, batch: int = 0, steps: int = 0) -> List[str]:
    """The measurement (`doctor_bench`) as a command for every host (with `model`: each host's speed at it)."""
    speed = ["--model", model, "--batch", str(batch), "--steps", str(steps)] if model else []
    return [python, "-m", "lightning_mccl.launcher.doctor_bench", "--size-mib", f"{size_mib:g}", "--iters",
            str(iters), "--latency-iters", str(latency_iters), "--pg-timeout", f"{pg_timeout:g}", *speed]


class CapturedOutput:
    """Keeps every rank's lines (and echoes them to stderr, prefixed, when `echo`)."""

    def __init__(self, specs: Sequence[RankSpec], echo: bool = False):
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
        return [t for t in self.lines.get(rank, []) if not t.startswith((PROBE_MARKER, RESULT_MARKER, REACH_MARKER))
                ][-n:]

    def unreachable(self) -> List[dict]:
        """The connections the measurement's ranks could not make (`doctor_reach`): every rank that knew them
        printed them, as a REACH_MARKER line."""
        found = {}
        for rank in sorted(self.lines):
            for f in self.marked(rank, REACH_MARKER) or []:
                found[(f["from"], f["to"])] = f
        return [found[k] for k in sorted(found)]


@dataclass
class HostReport:
    node_rank: int
    name: str
    addr: str
    returncode: Optional[int]
    info: Optional[dict]
    output: List[str]


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


def setup_findings(reports: Sequence[HostReport]) -> List[Finding]:
    return [f for r in reports if r.info is not None and r.info.get("setup")
            for f in judge(r.name, r.info["setup"], r.addr)]
