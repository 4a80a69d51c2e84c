"""`mccl doctor`: the pair schedule, the host checks, and real runs (--local 2 over mccl; a fake ssh fleet
with an unreachable host; a busy master port)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from cli_runner import MCCL, env_with_fake_ssh, killed_on_error, require_script, run_mccl
from lightning_mccl.launcher import free_port
from lightning_mccl.launcher.doctor_bench import pair_rounds
from lightning_mccl.launcher.doctor_checks import HostReport, check_hosts


def table_rows(stdout: str, title: str) -> list:
    """The rows (lists of cell texts) of the rich table printed under `title`."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("└"):
            break
        if line.startswith(("│", "┃")):
            rows.append([cell.strip() for cell in line.strip("│┃").replace("┃", "│").split("│")])
    return rows


@pytest.mark.parametrize("n", range(1, 10))
def test_pair_rounds_measure_every_pair_once_in_rounds_of_disjoint_pairs(n):
    rounds = pair_rounds(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    for r in rounds:
        busy = [x for p in r for x in p]
        assert len(busy) == len(set(busy)), f"rank in two pairs at once in round {r}"
    assert len(rounds) == (0 if n < 2 else n - 1 + n % 2)


def _info(**overrides):
    info = {"python": "3.11.7", "torch": "2.14.1", "lightning_mccl": "0.1.0", "lightning": "2.6.6",
            "executable": "/venv/bin/python", "port_error": None}
    info.update(overrides)
    return info


def test_host_checks_name_differing_versions_missing_packages_and_silent_hosts():
    reports = [HostReport(0, "mac-0", "10.0.0.1", 0, _info(port_error="Address already in use"), []),
               HostReport(1, "mac-1", "10.0.0.2", 0, _info(torch="2.13.0"), []),
               HostReport(2, "mac-2", "10.0.0.3", 0, _info(lightning_mccl=None), []),
               HostReport(3, "mac-3", "10.0.0.4", 255, None, ["ssh: connect to host mac-3 port 22: Timed out", ""])]
    problems = check_hosts(reports)
    assert problems == [
        "mac-0: the master port cannot be bound (Address already in use); is another run still going? "
        "Use --master-port",
        "mac-2: lightning-mccl is not installed for /venv/bin/python",
        "mac-3: no answer (exit code 255): ssh: connect to host mac-3 port 22: Timed out",
        "different torch versions: 2.14.1 on mac-0, mac-2; 2.13.0 on mac-1",
        "different lightning-mccl versions: 0.1.0 on mac-0, mac-1; missing on mac-2",
    ]
    assert check_hosts([HostReport(i, f"m{i}", "a", 0, _info(), []) for i in range(3)]) == []


TINY = """
import torch

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 10)
        self.example_input_array = torch.zeros(2, 32)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
"""


def test_doctor_local_2_measures_pair_0_1_the_allreduce_and_each_hosts_speed(tmp_path):
    (tmp_path / "doctor_tiny.py").write_text(TINY)  # the ranks run in tmp_path: module:Class imports from there
    r = run_mccl("doctor", "--local", "2", "--iters", "3", "--latency-iters", "20", "--model", "doctor_tiny:Tiny",
                 "--batch", "8", "--steps", "3", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.elapsed < 60, f"mccl doctor --local 2 took {r.elapsed:.0f} s"
    hosts = table_rows(r.stdout, "Hosts")
    assert [row[:4] for row in hosts[1:]] == [["0", "local", "127.0.0.1", "yes"], ["1", "local", "127.0.0.1", "yes"]]
    links = table_rows(r.stdout, "Links")
    assert links[0][:5] == ["pair", "hosts", "latency µs", "a→b Gbit/s", "b→a Gbit/s"]
    (pair,) = [row for row in links[1:] if row[0] == "(0, 1)"]
    latency, ab, ba = (float(x) for x in pair[2:5])
    assert latency > 0 and ab > 0 and ba > 0, pair
    allreduce = table_rows(r.stdout, "Allreduce")
    assert allreduce[0] == ["ranks", "size", "time ms", "algbw Gbit/s", "busbw Gbit/s"]
    assert allreduce[1][:2] == ["2", "16 MiB"] and float(allreduce[1][4]) > 0
    speed = table_rows(r.stdout, "Speed")
    assert speed[0] == ["rank", "host", "device", "step ms", "samples/s", "of median", "state"]
    assert [row[:2] for row in speed[1:]] == [["0", "local"], ["1", "local"]]
    for row in speed[1:]:  # both ranks share this machine's CPU: which is faster is not the test's to say
        step_ms, rate = float(row[3]), float(row[4])
        # batch / step, within what the table's rounding allows: step ms to 0.01 (0.005 / step_ms), samples/s to
        # 0.1 (0.05 / rate: more than 0.001 below 50 samples/s, as on a loaded 2-core machine)
        assert step_ms > 0 and rate * step_ms / 1e3 == pytest.approx(8, rel=0.006 / step_ms + 0.06 / rate), row
    assert float(speed[1][5]) + float(speed[2][5]) == pytest.approx(2.0, abs=0.02)  # the median of two: their mean
    reduction = table_rows(r.stdout, "Reduction path")
    assert reduction[0] == ["rank", "host", "CPU reducer", "MPS tensors", "MPS per-value work"]
    assert [row[0] for row in reduction[1:]] == ["0", "1"]
    assert all(row[1].startswith("local (") for row in reduction[1:]), reduction  # the launcher's host names
    for row in reduction[1:]:
        assert row[2] in ("avx2 (selected at run time)", "sse2 (this cpu has no avx2)"), row
        assert row[3] == "no MPS device", row
        assert row[4].startswith("torch ops: ") and "no MPS device" in row[4], row  # the group's choice
    assert "all checks passed" in r.stderr


def test_doctor_reports_an_unreachable_host_and_does_not_measure(tmp_path):
    hostfile = tmp_path / "fleet.yaml"
    hostfile.write_text("hosts:\n  - {name: mac-0, addr: 127.0.0.1}\n  - {name: unreachable, addr: 127.0.0.2}\n")
    r = run_mccl("doctor", "--hostfile", hostfile, env=env_with_fake_ssh())
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("unreachable: no answer (exit code 255): ssh: connect to host unreachable port 22: Connection refused"
            in r.stderr)
    assert "255 is ssh's own exit code" in r.stderr
    assert "not measuring the links" in r.stderr and "Links" not in r.stdout
    rows = table_rows(r.stdout, "Hosts")
    assert rows[1][3] == "yes" and rows[2][:4] == ["1", "unreachable", "127.0.0.2", "no (exit 255)"]


def test_doctor_reports_a_busy_master_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_mccl("doctor", "--local", "2", "--master-port", port, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "local: the master port cannot be bound" in r.stderr and "not measuring the links" in r.stderr
    assert table_rows(r.stdout, "Hosts")[1][-1] == "in use"


def test_doctor_reports_a_measurement_that_runs_out_of_time(tmp_path):
    r = run_mccl("doctor", "--local", "2", "--timeout", "0.5", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the ranks did not finish within 0.5 s: stopping them" in r.stderr
    assert "the measurement failed (timeout, exit code 124)" in r.stderr and "Links" not in r.stdout


def test_a_host_0_addr_of_another_machine_is_named_before_anything_waits(tmp_path):
    # host 0's addr is every rank's MASTER_ADDR: one of another machine (198.51.100.7, TEST-NET-2) would leave
    # the measurement waiting for a rendezvous that is not there
    hostfile = tmp_path / "fleet.yaml"
    hostfile.write_text("hosts:\n  - {name: mac-0, addr: 198.51.100.7}\n  - {name: mac-1, addr: 127.0.0.2}\n")
    r = run_mccl("doctor", "--hostfile", hostfile, env=env_with_fake_ssh(), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert "[problem] mac-0: addr: addr 198.51.100.7 is none of this host's addresses (" in err, err
    assert "not measuring the links" in err and "Links" not in r.stdout
    addr = {row[0]: row[2:4] for row in table_rows(r.stdout, "Host setup")[1:] if row[1] == "addr"}
    assert addr == {"mac-0": ["fail", addr["mac-0"][1]], "mac-1": ["ok", "127.0.0.2 is loopback (lo)"]}, addr


def test_the_measurements_rendezvous_ends_within_its_timeout_with_a_named_error(tmp_path):
    port = free_port()  # nobody serves it: rank 0 never came
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1", "WORLD_SIZE": "2",
           "MCCL_RENDEZVOUS_REPORT_S": "1"}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "lightning_mccl.launcher.doctor_bench", "--pg-timeout", "2"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert time.monotonic() - start < 30  # torch's import, then 2 s
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"RendezvousError: rank 1 could not reach rank 0's rendezvous at 127.0.0.1:{port} within "
                           "2 s"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_ctrl_c_during_the_measurement_prints_one_line(tmp_path):
    require_script()
    proc = subprocess.Popen([MCCL, "doctor", "--local", "2", "--size-mib", "64", "--iters", "1000"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    with killed_on_error(proc):
        before = []
        for line in proc.stderr:  # up to the start of the measurement
            before.append(line)
            if "measuring over mccl" in line:
                break
        time.sleep(3.0)  # the ranks importing torch, at the rendezvous or measuring
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, "".join(before) + err
    assert err.splitlines() == [
        "mccl doctor: received SIGINT: stopping all ranks (send it again to kill them at once)"], err
    assert "Links" not in out and "frame #" not in out + err
