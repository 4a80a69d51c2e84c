"""`mccl doctor --help` lists the host checks from their declaration (host_checks.CHECKS): every check, the setup
checks first, then the measurement's, each grouped by the hosts it runs on, and a check added to the declaration
appears in the help, and runs, without touching either."""
from __future__ import annotations

from lightning_mccl.cli import main
from lightning_mccl.launcher import host_checks
from lightning_mccl.launcher.host_checks import CHECKS, EVERY, MACOS, MEASURED, SETUP, Check


def _help(capsys) -> list:
    assert main(["doctor", "--help"]) == 0
    out = capsys.readouterr().out
    return out[out.index("host setup checks"):].splitlines()


def test_the_help_lists_every_host_check_under_its_stage_and_hosts(capsys):
    lines = _help(capsys)
    at = [next(i for i, line in enumerate(lines) if line.startswith(f"    {c.name} ") and line.endswith(c.about))
          for c in CHECKS]
    assert len([line for line in lines if line.startswith("    ")]) == len(CHECKS)
    measured = lines.index("checks of the measurement:")
    assert all((i > measured) == (c.stage == MEASURED) for i, c in zip(at, CHECKS))
    setup = [(i, c) for i, c in zip(at, CHECKS) if c.stage == SETUP]
    assert lines[1] == f"  {EVERY}:"
    macos = lines.index(f"  {MACOS} hosts also:")
    assert all((i > macos) == (c.hosts == MACOS) for i, c in setup)
    assert {"addr", "interface", "firewall", "sleep", "display", "power"} <= {c.name for c in CHECKS}  # macs.md


def test_a_check_added_to_the_declaration_is_in_the_help_and_runs(capsys, monkeypatch):
    clock = Check("clock", MACOS, SETUP, "whether the clock is set", lambda host, probe: host_checks.Finding(
        host, "clock", host_checks.OK, "checked"))
    monkeypatch.setattr(host_checks, "CHECKS", CHECKS + (clock,))
    assert any(line.startswith("    clock ") and line.endswith("whether the clock is set") for line in _help(capsys))
    assert [f.check for f in host_checks.judge("mac", {"system": "Darwin"})][-1] == "clock"
    assert "clock" not in [f.check for f in host_checks.judge("linux", {"system": "Linux"})]
