"""`mccl doctor`'s setup checks from canned command outputs (macOS's socketfilterfw, pmset, xcode-select,
networksetup, route, ipconfig; Linux's ip), each failing check with its exact fix; then a real doctor run
through the stand-in ssh showing the interface and address each rank will use. The macOS checks of a long
GPU run (display, watchdog, power, thermal, GPU load): test_mac_checks.py."""
from __future__ import annotations

import os
import sys

from cli_runner import env_with_fake_ssh, run_mccl
from lightning_mccl.launcher import free_port, host_probe
from lightning_mccl.launcher.host_checks import CHECKS, FAIL, OK, WARN, hardware_ports, judge, path_fix
from test_doctor import table_rows
from test_launch import write_hostfile

FW = host_probe.SOCKETFILTERFW
PY = "/Users/me/proj/.venv/bin/python3.11"
PORTS = """
Hardware Port: Ethernet
Device: en0
Ethernet Address: 3c:a6:f6:00:00:01

Hardware Port: Wi-Fi
Device: en1
Ethernet Address: 3c:a6:f6:00:00:02

Hardware Port: Thunderbolt Bridge
Device: bridge0
Ethernet Address: 36:a6:f6:00:00:03

VLAN Configurations
===================
"""
ROUTE_WIFI = """   route to: 10.0.0.1
destination: 10.0.0.0
       mask: 255.255.255.0
  interface: en1
      flags: <UP,DONE,CLONING,STATIC>
"""
PMSET_SLEEPS = """System-wide power settings:
Currently in use:
 standby              0
 Sleep On Power Button 1
 hibernatefile        /var/vm/sleepimage
 powernap             1
 disksleep            10
 sleep                10 (sleep prevented by sharingd)
 displaysleep         10
"""
PMSET_AWAKE = PMSET_SLEEPS.replace(" sleep                10 (sleep prevented by sharingd)", " sleep                0")


def mac_probe(outputs, ifname=None, panic_dir="/nonexistent"):
    """A macOS probe collected with canned outputs: {command name (host_probe.commands_for): [rc, text]}; a
    command not given did not answer."""
    env = {"MASTER_ADDR": "10.0.0.1", **({"MCCL_SOCKET_IFNAME": ifname} if ifname else {})}
    names = {tuple(argv): name for name, argv in host_probe.commands_for(
        "Darwin", ifname, "10.0.0.1", os.path.realpath(sys.executable)).items()}
    probe = host_probe.collect(run=lambda argv: outputs.get(names[tuple(argv)]), system="Darwin", environ=env,
                               panic_dir=panic_dir)
    probe["executable"] = "/Users/me/proj/.venv/bin/python"
    probe["binary"] = PY  # what the venv's python links to: the firewall's rules name this one
    probe["route_addr"] = "10.0.0.7"  # what the kernel said (not asked here: this is not that Mac)
    return probe


def _mac(outputs, ifname=None):
    return {f.check: f for f in judge("studio-03", mac_probe(outputs, ifname))}


def test_a_badly_set_up_mac_gets_a_fix_for_every_check():
    got = _mac({"firewall": [0, "Firewall is enabled. (State = 1)\n"],
                "firewall_app": [0, f"The application {PY} is not part of the firewall\n"],
                "pmset": [0, PMSET_SLEEPS], "xcode": [2, "xcode-select: error: unable to get active developer "
                                                     "directory, use `sudo xcode-select --switch path/to/Xcode.app`\n"],
                "ports": [0, PORTS], "route": [0, ROUTE_WIFI]})
    assert (got["firewall"].state, got["firewall"].fix) == (
        FAIL, f"sudo {FW} --add {PY} && sudo {FW} --unblockapp {PY}")
    assert "has no rule for" in got["firewall"].detail
    assert (got["sleep"].state, got["sleep"].fix) == (WARN, "sudo pmset -a sleep 0")
    assert "sleeps after 10 min idle" in got["sleep"].detail
    assert (got["Xcode CLT"].state, got["Xcode CLT"].fix) == (WARN, "xcode-select --install")
    assert got["interface"].state == WARN
    assert got["interface"].detail == ("ranks listen on 10.0.0.7 via en1 (routes to 10.0.0.1), Wi-Fi: Wi-Fi is slow "
                                       "and drops packets")
    assert got["interface"].fix == "connect Ethernet and set `ifname: en0` (Ethernet) for studio-03 in the hostfile"
    assert got["path"].detail.endswith(" with /Users/me/proj/.venv/bin/python")


def test_a_well_set_up_mac_passes_every_check():
    got = _mac({"firewall": [0, "Firewall is enabled. (State = 1)\n"],
                "firewall_app": [0, f"The application {PY} is permitted\n"],
                "blockall": [0, "Firewall has block all state set to disabled.\n"],
                "stealth": [0, "Firewall stealth mode is off\n"],
                "pmset": [0, PMSET_AWAKE], "xcode": [0, "/Library/Developer/CommandLineTools\n"],
                "ports": [0, PORTS], "ifaddr": [0, "10.0.0.7\n"]}, ifname="en0")
    assert {c: f.state for c, f in got.items()} == {c: OK for c in ("interface", "path", "firewall", "sleep", "Xcode CLT",
                                                                    "display", "watchdog", "power")}
    assert got["interface"].detail == "ranks listen on 10.0.0.7 via en0 (ifname), Ethernet"
    assert got["firewall"].detail == f"application firewall on, {PY} allowed"
    assert _mac({"firewall": [0, "Firewall is disabled. (State = 0)\n"]})["firewall"].state == OK
    blocked = _mac({"firewall": [0, "Firewall is enabled. (State = 1)\n"],
                    "firewall_app": [0, f"The application {PY} is blocked\n"]})["firewall"]
    assert blocked.state == FAIL and "blocks" in blocked.detail


def test_stealth_mode_and_block_all_are_named():
    on = {"firewall": [0, "Firewall is enabled. (State = 1)\n"]}
    stealthy = _mac({**on, "firewall_app": [0, f"The application {PY} is not part of the firewall\n"],
                     "stealth": [0, "Stealth mode enabled\n"]})["firewall"]
    assert stealthy.state == FAIL and stealthy.fix == f"sudo {FW} --add {PY} && sudo {FW} --unblockapp {PY}"
    assert stealthy.detail.endswith("stealth mode on: a connection it blocks is dropped, and a peer waits for its "
                                    "timeout"), stealthy.detail
    walled = _mac({**on, "firewall_app": [0, f"The application {PY} is permitted\n"],
                   "blockall": [0, "Firewall has block all state set to enabled.\n"]})["firewall"]
    assert (walled.state, walled.fix) == (FAIL, f"sudo {FW} --setblockall off")
    assert "blocking all incoming connections" in walled.detail


def test_every_check_is_declared_once_with_what_it_looks_at():
    names = [c.name for c in CHECKS]
    assert len(names) == len(set(names))
    assert {"display", "watchdog", "power", "thermal", "GPU load", "firewall", "connections", "speed"} <= set(names)
    assert all(c.about and c.hosts in ("every host", "macOS") and c.stage in ("setup", "measurement") for c in CHECKS)
    # judge runs the setup checks in their declared order
    order = [f.check for f in judge("studio-03", mac_probe({"pmset": [0, PMSET_AWAKE]}))]
    assert order == [n for n in names if n in order]


def test_an_ifname_without_an_address_fails_listing_the_ports():
    got = _mac({"ports": [0, PORTS], "ifaddr": [1, ""]}, ifname="en5")
    assert got["interface"].state == FAIL
    assert got["interface"].fix == ("set this host's ifname in the hostfile to a connected interface: en0 (Ethernet), "
                                    "en1 (Wi-Fi), bridge0 (Thunderbolt Bridge)")
    assert hardware_ports(PORTS) == {"en0": "Ethernet", "en1": "Wi-Fi", "bridge0": "Thunderbolt Bridge"}


def test_linux_hosts_get_the_interface_and_path_checks_only():
    probe = host_probe.collect(run=lambda argv: [0, "local 127.0.0.2 dev lo src 127.0.0.1 uid 0 \\    cache <local> "],
                               system="Linux", environ={"MASTER_ADDR": "127.0.0.2"})
    got = judge("box", probe)
    assert [f.check for f in got] == ["interface", "path"]
    assert got[0].detail == "ranks listen on 127.0.0.1 via lo (routes to 127.0.0.2)"


def test_a_missing_working_directory_is_explained():
    fix = path_fix(["mccl-rank[mac-1 r1]: cannot change to the working directory /Users/me/proj: No such file"])
    assert fix == ("every host needs the same absolute paths: put the project at /Users/me/proj on this host, "
                   "or give --chdir DIR")


def test_doctor_shows_the_interface_and_address_of_every_host(tmp_path):
    hostfile = write_hostfile(tmp_path / "fleet.yaml", 2, ifname0="lo")
    r = run_mccl("doctor", "--hostfile", hostfile, "--master-port", free_port(), "--size-mib", "0.25", "--iters", "1", "--latency-iters", "2",
                 env=env_with_fake_ssh())
    assert r.returncode == 0, r.stdout + r.stderr
    rows = table_rows(r.stdout, "Host setup")
    assert rows[0] == ["host", "check", "state", "detail", "fix"]
    interface = {row[0]: row[3] for row in rows[1:] if row[1] == "interface"}
    assert interface["mac-0"].startswith("ranks listen on 127.0.0.1 via lo (ifname)"), rows
    assert interface["mac-1"].startswith("ranks listen on 127.0.0.1 via lo (routes to"), rows
    assert "Links (mccl send/recv)" in r.stdout


def test_the_addr_check_says_which_interface_has_it_or_which_addresses_the_host_has():
    probe = {"addresses": [["lo0", "127.0.0.1"], ["en0", "10.0.0.12"], ["en0", "fe80::1"], ["en1", "192.168.1.30"]],
             "route_addr": "10.0.0.12"}
    ok = judge("studio-02", probe, "10.0.0.12")[0]
    assert (ok.check, ok.state, ok.detail) == ("addr", OK, "10.0.0.12 is this host's (en0)")
    wrong = judge("studio-02", probe, "10.0.0.1")[0]
    assert (wrong.state, wrong.fix) == (FAIL, "set addr: 10.0.0.12 for studio-02 in the hostfile")
    assert wrong.detail.startswith("addr 10.0.0.1 is none of this host's addresses (10.0.0.12 (en0), 192.168.1.30 "
                                   "(en1)): its peers would connect to another machine"), wrong.detail
    assert judge("box", {"addresses": [["lo", "127.0.0.1"]]}, "127.0.0.2")[0].detail == "127.0.0.2 is loopback (lo)"
    assert [f.check for f in judge("box", {"addresses": None}, "10.0.0.1")] == ["interface", "path"]  # not listed
