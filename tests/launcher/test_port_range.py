"""MCCL_PORT_RANGE (`mccl launch --port-range`): ranks listen only on ports of the range, a range with too
few free ports fails with an error naming it, and a malformed one is refused by the launcher and the engine."""
from __future__ import annotations

import re
import socket

from cli_runner import RANK_PROGRAMS, run_mccl
from lightning_mccl.launcher import free_port

LISTENING = re.compile(r"^\[local r(\d)\]\s+\[mccl INFO\] rank \d/\d listening on 127\.0\.0\.1:(\d+) ")


def _free_range(n: int) -> int:
    """The lowest port of n consecutive ports on 127.0.0.1 that are free now."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise AssertionError(f"no {n} consecutive free ports found")


def test_ranks_listen_only_inside_the_range():
    base = _free_range(3)
    r = run_mccl("launch", "--local", "3", "--port-range", f"{base}-{base + 2}", "--env", "MCCL_DEBUG=INFO",
                 "--", "python", RANK_PROGRAMS, "allreduce")
    assert r.returncode == 0, r.stdout + r.stderr
    ports = {int(m.group(1)): int(m.group(2)) for m in map(LISTENING.match, r.stdout.splitlines()) if m}
    assert sorted(ports) == [0, 1, 2], r.stdout
    assert sorted(ports.values()) == [base, base + 1, base + 2], r.stdout  # one port each, all in the range
    assert r.stdout.count("sum=[6.0, 6.0, 6.0, 6.0]") == 3, r.stdout


def test_a_range_with_too_few_ports_names_it():
    base = _free_range(1)
    r = run_mccl("launch", "--local", "2", "--port-range", f"{base}-{base}", "--", "python", RANK_PROGRAMS,
                 "allreduce")
    assert r.returncode != 0, r.stdout + r.stderr
    assert (f"all 1 port(s) of MCCL_PORT_RANGE={base}-{base} are in use (every rank on a host needs its own port "
            "while connecting, and other programs may hold some): widen the range") in r.stdout, r.stdout


def test_a_malformed_range_is_refused():
    r = run_mccl("launch", "--local", "2", "--port-range", "29700-29600", "--", "true")
    assert r.returncode == 2 and "'29700-29600' is not a port range LOW-HIGH" in r.stderr, r.stderr
    r = run_mccl("launch", "--local", "1", "--env", "MCCL_PORT_RANGE=29600:29700", "--", "python", RANK_PROGRAMS,
                 "allreduce")
    assert r.returncode != 0
    assert ("MCCL_PORT_RANGE='29600:29700' is not a port range LOW-HIGH with 1 <= LOW <= HIGH <= 65535 "
            "(example: 29600-29700)") in r.stdout, r.stdout
