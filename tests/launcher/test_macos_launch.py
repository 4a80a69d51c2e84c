"""`mccl launch`'s macOS options through the stand-in ssh: --caffeinate runs `caffeinate -ims -w PID` beside
each rank, never -d (a stand-in caffeinate in fake_bin logs its arguments), off with --no-caffeinate and, by default,
on hosts that are not macOS; --port-range reaches every rank as MCCL_PORT_RANGE."""
from __future__ import annotations

import sys
from pathlib import Path

from cli_runner import env_with_fake_ssh, fake_ssh_calls, run_mccl
from test_launch import prefixed, write_hostfile

# Prints the rank's pid and what the launcher set for it.
SHOW = "import os; print(os.getpid(), os.environ.get('MCCL_PORT_RANGE'), os.environ.get('MCCL_CAFFEINATE'))"


def _caffeinate_calls(log: Path) -> list:
    return [p.read_text().strip() for p in sorted(log.parent.glob(log.name + ".*"))]


def _launch(tmp_path, *options):
    hostfile = write_hostfile(tmp_path / "fleet.yaml", 2)
    ssh_log, caf_log = tmp_path / "ssh.log", tmp_path / "caffeinate.log"
    env = env_with_fake_ssh(ssh_log, FAKE_CAFFEINATE_LOG=str(caf_log))
    r = run_mccl("launch", "--hostfile", hostfile, *options, "--", "python", "-c", SHOW, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(h for h, _ in fake_ssh_calls(ssh_log)) == ["mac-0", "mac-1"]
    shown = {label: lines[0].split() for label, lines in prefixed(r.stdout).items()}
    return shown, _caffeinate_calls(caf_log)


def test_caffeinate_keeps_every_host_awake_while_its_rank_runs(tmp_path):
    shown, calls = _launch(tmp_path, "--caffeinate", "--port-range", "29600-29700")
    assert sorted(calls) == sorted(f"-ims -w {pid}" for pid, _, _ in shown.values()), (calls, shown)
    # -d keeps the display awake, which sets off macOS 26's GPU watchdog under sustained Metal work
    assert not [c for c in calls for flag in c.split() if flag.startswith("-") and "d" in flag], calls
    for pid, port_range, mode in shown.values():
        assert port_range == "29600-29700" and mode == "on"


def test_caffeinate_is_off_when_asked_and_by_default_off_macos(tmp_path):
    assert sys.platform != "darwin"  # these tests run on Linux: auto means off here
    shown, calls = _launch(tmp_path)
    assert calls == [] and {mode for _, port_range, mode in shown.values()} == {"auto"}
    assert {port_range for _, port_range, _ in shown.values()} == {"None"}
    (tmp_path / "again").mkdir()
    shown, calls = _launch(tmp_path / "again", "--no-caffeinate")
    assert calls == [] and {mode for _, _, mode in shown.values()} == {"off"}
