"""The switch emulator's commands that run too long, and its probe's receiver that never starts, end in a
SwitchError naming what was being done and the command (what `mccl switch` prints as one line), never in a
traceback or a wait without end. No root needed: the commands here are `sleep`, and the probe runs over
loopback in a stand-in for a fleet."""
from __future__ import annotations

import subprocess
import sys

import pytest

from lightning_mccl.switch import SwitchError, measure_goodput, netns, probe


class LoopbackFleet:
    """What the probe needs of a SwitchFleet, with every host on this machine's loopback; `receiver_argv`
    replaces the command run on host 1 (the receiving host)."""

    rate_bps = 10**9

    def __init__(self, receiver_argv=None):
        self.receiver_argv = receiver_argv

    def exec_argv(self, host, argv):
        return list(self.receiver_argv) if host == 1 and self.receiver_argv else list(argv)

    def host_ip(self, host):
        return "127.0.0.1"


def test_a_timed_out_command_becomes_a_switch_error_naming_it():
    error = netns.timed_out(subprocess.TimeoutExpired(["/usr/sbin/ip", "netns", "add", "mccl-a-h0"], 30.0),
                            "adding host 0")
    assert isinstance(error, SwitchError)
    assert str(error) == "adding host 0: `/usr/sbin/ip netns add mccl-a-h0` did not finish within 30 s"
    assert str(netns.timed_out(subprocess.TimeoutExpired("tc qdisc show", 1.5))) == \
        "`tc qdisc show` did not finish within 1.5 s"


def test_an_ip_command_past_its_timeout_raises_a_switch_error(monkeypatch):
    monkeypatch.setattr(netns, "COMMAND_TIMEOUT_S", 0.2)
    with pytest.raises(SwitchError, match=r"^listing links: `\S*sleep 5` did not finish within 0.2 s$"):
        netns.run(["sleep", "5"], what="listing links")


def test_a_probe_command_past_its_timeout_raises_a_switch_error():
    with pytest.raises(SwitchError, match=r"^probe: the sender on host 0: `sleep 5` did not finish within 0.2 s$"):
        probe._run(["sleep", "5"], 0.2, "probe: the sender on host 0")


def test_a_receiver_that_never_starts_fails_the_probe_after_the_start_timeout(monkeypatch):
    monkeypatch.setattr(probe, "START_TIMEOUT_S", 0.5)
    fleet = LoopbackFleet(receiver_argv=[sys.executable, "-c", "import time; time.sleep(30)"])
    with pytest.raises(SwitchError, match=r"^probe: the receiver on host 1 did not start within 0.5 s"):
        measure_goodput(fleet, 0, 1, seconds=1.0, tool="python")


def test_a_receiver_that_prints_no_port_is_named():
    fleet = LoopbackFleet(receiver_argv=[sys.executable, "-c", "print('hello'); import time; time.sleep(30)"])
    with pytest.raises(SwitchError, match=r"^probe: the receiver on host 1 did not start: 'hello'$"):
        measure_goodput(fleet, 0, 1, seconds=1.0, tool="python")


def test_the_python_probe_measures_loopback():
    result = measure_goodput(LoopbackFleet(), 0, 1, seconds=1.0, tool="python")
    assert result.tool == "python" and result.bits_per_second > 0
