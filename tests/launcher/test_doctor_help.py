"""`mccl doctor --help` lists the host setup checks from their declaration (host_checks.CHECKS): every check,
grouped by the hosts it runs on, and a check added to the declaration appears in the help without touching it."""
from __future__ import annotations

from lightning_mccl.cli import main
from lightning_mccl.launcher import host_checks
from lightning_mccl.launcher.host_checks import CHECKS, EVERY_HOST, MACOS, HostCheck


def _help(capsys) -> list:
    assert main(["doctor", "--help"]) == 0
    out = capsys.readouterr().out
    return out[out.index("host setup checks"):].splitlines()


def test_the_help_lists_every_host_check_under_the_hosts_it_runs_on(capsys):
    lines = _help(capsys)
    at = [next(i for i, line in enumerate(lines) if line.startswith(f"    {c.name} ") and line.endswith(c.what))
          for c in CHECKS]
    assert at == sorted(at) and len([line for line in lines if line.startswith("    ")]) == len(CHECKS)
    assert lines[1] == f"  {EVERY_HOST}:"
    macos = lines.index(f"  {MACOS} hosts also:")
    assert all((i > macos) == (c.hosts == MACOS) for i, c in zip(at, CHECKS))
    assert {"addr", "interface", "firewall", "sleep"} <= {c.name for c in CHECKS}  # docs/macs.md, step 6


def test_a_check_added_to_the_declaration_is_in_the_help_and_runs(capsys, monkeypatch):
    display = HostCheck("display", MACOS, "whether the display sleeps", lambda host, probe, addr: host_checks.Finding(
        host, "display", host_checks.OK, "checked"))
    monkeypatch.setattr(host_checks, "CHECKS", CHECKS + (display,))
    assert "    display    whether the display sleeps" in _help(capsys)
    assert [f.check for f in host_checks.judge("mac", {"system": "Darwin"})][-1] == "display"
    assert "display" not in [f.check for f in host_checks.judge("linux", {"system": "Linux"})]
