"""The goodput of one emulated link: TCP from host `a` to host `b`, with iperf3 when it is on PATH, else with
`tcp_probe` (a Python sender and receiver). Both report the steady state, after the first half second."""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

from . import rates
from .netns import SwitchError, timed_out

SKIP_S = 0.5
START_TIMEOUT_S = 15.0  # for a receiver (tcp_probe, iperf3 -s) to say it is listening


@dataclass(frozen=True)
class ProbeResult:
    a: int
    b: int
    bits_per_second: float
    rate_bps: int
    tool: str

    @property
    def fraction_of_rate(self) -> float:
        return self.bits_per_second / self.rate_bps

    @property
    def fraction_of_line_rate(self) -> float:
        """Against the TCP goodput a shaped link can carry (0.956 x rate): 1.0 is a perfect link."""
        return self.bits_per_second / rates.line_rate_goodput(self.rate_bps)


def measure_goodput(fleet, a: int = 0, b: int = 1, seconds: float = 3.0, tool: Optional[str] = None) -> ProbeResult:
    """TCP goodput from host a to host b of `fleet` (a SwitchFleet that is up). tool: "iperf3", "python" or
    None (iperf3 if found)."""
    if a == b:
        raise ValueError(f"probe needs two different hosts, got a = b = {a}")
    if seconds <= SKIP_S:
        raise ValueError(f"probe seconds={seconds}: must be longer than the {SKIP_S} s skipped at the start")
    if tool is None:
        tool = "iperf3" if shutil.which("iperf3") else "python"
    if tool == "iperf3":
        bps = _iperf3(fleet, a, b, seconds)
    elif tool == "python":
        bps = _python(fleet, a, b, seconds)
    else:
        raise ValueError(f"probe tool {tool!r}: use 'iperf3' or 'python'")
    return ProbeResult(a=a, b=b, bits_per_second=bps, rate_bps=fleet.rate_bps, tool=tool)


def _server(fleet, b: int, argv) -> subprocess.Popen:
    return subprocess.Popen(fleet.exec_argv(b, argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float, what: str) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise SwitchError(f"probe: {what} did not finish within {timeout:g} s; stderr: {err.strip()[-500:]}")
    if proc.returncode != 0:
        raise SwitchError(f"probe: {what} failed (exit code {proc.returncode}): {err.strip()[-800:]}")
    return out


def _python(fleet, a: int, b: int, seconds: float) -> float:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tcp_probe.py")
    receiver = _server(fleet, b, [sys.executable, script, "recv", "--bind", fleet.host_ip(b), "--skip", str(SKIP_S)])
    try:
        first = _wait_for_line(receiver, "\n", START_TIMEOUT_S, f"the receiver on host {b}").splitlines()[0]
        try:
            port = json.loads(first)["port"]
        except (ValueError, KeyError, TypeError):
            raise SwitchError(f"probe: the receiver on host {b} did not start: {first!r}") from None
        sender = _run(fleet.exec_argv(a, [sys.executable, script, "send", "--to", fleet.host_ip(b), "--port",
                                          str(port), "--seconds", str(seconds)]),
                      seconds + 30, f"probe: the sender on host {a}")
        if sender.returncode != 0:
            raise SwitchError(f"probe: the sender on host {a} failed: {sender.stderr.strip()[-800:]}")
        out = _finish(receiver, 30, f"the receiver on host {b}")
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return float(json.loads(out.strip().splitlines()[-1])["bits_per_second"])


def _iperf3(fleet, a: int, b: int, seconds: float) -> float:
    port = "5201"  # each host is its own network namespace: nothing else listens there
    # --forceflush: the "Server listening" line arrives at once, and the client starts only after it
    server = _server(fleet, b, ["iperf3", "-s", "-1", "--forceflush", "-B", fleet.host_ip(b), "-p", port])
    try:
        _wait_for_line(server, "Server listening", START_TIMEOUT_S, f"the iperf3 server on host {b}")
        client = _run(fleet.exec_argv(a, ["iperf3", "-c", fleet.host_ip(b), "-p", port, "-t", f"{seconds:g}",
                                          "-O", f"{SKIP_S:g}", "-J"]),
                      seconds + 30, f"probe: iperf3 from host {a}")
        if client.returncode != 0:
            raise SwitchError(f"probe: iperf3 from host {a} failed: {(client.stdout + client.stderr)[-800:]}")
        _finish(server, 30, f"the iperf3 server on host {b}")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return float(json.loads(client.stdout)["end"]["sum_received"]["bits_per_second"])


def _run(argv, timeout: float, what: str) -> subprocess.CompletedProcess:
    """`argv` to completion, its output captured; SwitchError naming `what` and the command after `timeout`."""
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise timed_out(e, what) from None


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float, what: str) -> str:
    """Reads `proc`'s stdout (raw: no buffer that select cannot see) until `text` appears; returns what it read."""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    seen = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            raise SwitchError(f"probe: {what} exited: {seen.decode(errors='replace')[-500:]} "
                              f"{proc.stderr.read()[-500:]}")
        seen += chunk
        if text.encode() in seen:
            return seen.decode(errors="replace")
    raise SwitchError(f"probe: {what} did not start within {timeout:g} s: {seen.decode(errors='replace')[-500:]}")
