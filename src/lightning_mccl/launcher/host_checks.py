"""`mccl doctor`'s host checks, declared once (`CHECKS`: what each looks at, on which hosts, from which stage),
and the network checks themselves: what `host_probe` collected on a host, judged, each with the exact fix.

Every host: whether the hostfile's ``addr`` for it is one of its own addresses (its peers connect there;
host 0's is every rank's MASTER_ADDR), and which interface has it; the interface and address its ranks
will listen on (MCCL_SOCKET_IFNAME from the hostfile's ``ifname``, else the interface that routes to
MASTER_ADDR), and Lightning's Gloo groups with them (GLOO_SOCKET_IFNAME, `host_net`); the working directory
and Python they run with; whether the interface is Wi-Fi (slow, and variable: a fleet wants Ethernet or a
Thunderbolt bridge). macOS hosts also get `mac_checks`' (firewall, sleep, Xcode, display, watchdog panics,
power, thermal, GPU load). The measurement's own checks (connections between every pair, each Mac's speed)
are `fleet_checks`'.

`judge(host, probe, addr)` returns the setup `Finding`s of one host, in CHECKS' order; `state` is ``ok``,
``warn`` (works, but see the fix) or ``fail`` (the job will not run or will hang until it is fixed).
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from ..hostfile import resolve
from . import mac_checks
from .fleet_checks import SLOW_FRACTION, check_connections, check_speed
from .findings import FAIL, OK, WARN, Finding, command_output

__all__ = ["CHECKS", "FAIL", "OK", "WARN", "Check", "Finding", "hardware_ports", "judge", "path_fix"]


def hardware_ports(text: str) -> Dict[str, str]:
    """{device: port name} from `networksetup -listallhardwareports` ("en0": "Ethernet", "en1": "Wi-Fi")."""
    ports, name = {}, None
    for line in text.splitlines():
        if line.startswith("Hardware Port:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Device:") and name is not None:
            ports[line.split(":", 1)[1].strip()] = name
            name = None
    return ports


def route_interface(text: str) -> Optional[str]:
    """The interface of `route -n get ADDR` (macOS: "interface: en0") or `ip -o route get ADDR` ("dev eth0")."""
    m = re.search(r"^\s*interface:\s*(\S+)", text, re.M) or re.search(r"\bdev\s+(\S+)", text)
    return m.group(1) if m else None


def interface_address(text: str) -> Optional[str]:
    """The address in `ipconfig getifaddr IF` (macOS: the bare address) or `ip -o -4 addr show dev IF`."""
    m = re.search(r"\binet\s+([0-9.]+)", text)
    if m:
        return m.group(1)
    m = re.fullmatch(r"\s*([0-9.]+)\s*", text)
    return m.group(1) if m else None


def _wired(ports: Dict[str, str]) -> List[str]:
    return [dev for dev, name in ports.items() if "ethernet" in name.lower() or "thunderbolt" in name.lower()]


def check_interface(host: str, probe: dict) -> Finding:
    ports = hardware_ports(command_output(probe, "ports")[1]) if command_output(probe, "ports") else {}
    ifname = probe.get("ifname")
    if ifname:
        got = command_output(probe, "ifaddr")
        addr = interface_address(got[1]) if got and got[0] == 0 else None
        if addr is None:
            choices = ", ".join(f"{d} ({n})" for d, n in ports.items()) or "see `ifconfig`"
            return Finding(host, "interface", FAIL, f"ifname {ifname} (MCCL_SOCKET_IFNAME) has no IPv4 address here",
                           f"set this host's ifname in the hostfile to a connected interface: {choices}")
        source = f"{ifname} (ifname)"
    else:
        got = command_output(probe, "route")
        ifname = route_interface(got[1]) if got else None
        addr = probe.get("route_addr")
        if addr is None:
            return Finding(host, "interface", FAIL, f"no route from this host to MASTER_ADDR={probe.get('master')}",
                           "check the network (and host 0's addr in the hostfile)")
        source = f"{ifname or '?'} (routes to {probe.get('master')})"
    kind = ports.get(ifname or "")
    detail = f"ranks listen on {addr} via {source}" + (f", {kind}" if kind else "")
    if probe.get("gloo_ifname"):
        detail += f"; Lightning's Gloo groups on {probe['gloo_ifname']}"
    if kind and "wi-fi" in kind.lower():
        wired = _wired(ports)
        fix = (f"connect Ethernet and set `ifname: {wired[0]}` ({ports[wired[0]]}) for {host} in the hostfile"
               if wired else "connect an Ethernet adapter (or a Thunderbolt cable) and set its `ifname` in the hostfile")
        return Finding(host, "interface", WARN, detail + ": Wi-Fi is slow and drops packets", fix)
    return Finding(host, "interface", OK, detail)


def _usable(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return not (ip.is_loopback or ip.is_link_local)


def check_addr(host: str, probe: dict) -> Optional[Finding]:
    """Whether the hostfile's addr for this host (``hostfile_addr``, resolved here) is one of its addresses, and
    on which interface; None when the probe could not list them (no lightning-mccl for the ranks' Python: reported
    as such) or no addr was given."""
    addr = probe.get("hostfile_addr")
    if not addr:
        return None
    have = probe.get("addresses")
    if have is None:
        return None
    wanted = resolve(addr)
    owner = next((name for name, address in have if address in wanted), None)
    if owner is not None:
        return Finding(host, "addr", OK, f"{addr} is this host's ({owner})")
    loopback = [name for name, address in have if ipaddress.ip_address(address).is_loopback]
    if loopback and wanted and all(ipaddress.ip_address(a).is_loopback for a in wanted):
        return Finding(host, "addr", OK, f"{addr} is loopback ({loopback[0]})")
    own = [f"{address} ({name})" for name, address in have if _usable(address)]
    routed = probe.get("route_addr")
    suggest = routed if routed and _usable(routed) else (own[0].split()[0] if own else None)
    return Finding(host, "addr", FAIL, f"addr {addr} is none of this host's addresses ({', '.join(own) or 'none'}): "
                   "its peers would connect to another machine (and host 0's is every rank's MASTER_ADDR)",
                   f"set addr: {suggest} for {host} in the hostfile" if suggest else
                   f"set {host}'s addr in the hostfile to one of its own addresses")


def check_path(host: str, probe: dict) -> Finding:
    return Finding(host, "path", OK, f"runs in {probe.get('cwd')} with {probe.get('executable')}")


EVERY, MACOS = "every host", "macOS"
SETUP, MEASURED = "setup", "measurement"


@dataclass(frozen=True)
class Check:
    """One of `mccl doctor`'s host checks: the name its tables show, the hosts it applies to, its stage (SETUP:
    judged from the probe, before anything runs; MEASURED: from doctor_bench's run), what it looks at (for
    `mccl doctor --help`) and its judgement: for SETUP, (host, probe) -> Finding or None (nothing to say); for
    MEASURED, (hosts, setups, what was measured) -> [Finding] (`fleet_checks`)."""
    name: str
    hosts: str
    stage: str
    about: str
    run: Callable


CHECKS = (
    Check("addr", EVERY, SETUP, "the hostfile's addr is one of the host's own addresses, and on which interface",
          check_addr),
    Check("interface", EVERY, SETUP, "the interface and address the ranks listen on (ifname, else the route to "
          "host 0), and Lightning's Gloo groups; Wi-Fi named", check_interface),
    Check("path", EVERY, SETUP, "the working directory and the Python the ranks run with", check_path),
    Check("firewall", MACOS, SETUP, "the application firewall lets the ranks' Python (its real file) accept "
          "connections: socketfilterfw --getglobalstate, --getblockall, --getappblocked, --getstealthmode",
          mac_checks.check_firewall),
    Check("sleep", MACOS, SETUP, "system sleep (pmset -g): a sleeping Mac leaves the job", mac_checks.check_sleep),
    Check("Xcode CLT", MACOS, SETUP, "the command-line tools that build lightning-mccl", mac_checks.check_xcode),
    Check("display", MACOS, SETUP, "display sleep, displays attached and on, what keeps them awake, the console "
          "user: macOS 26's GPU watchdog kills GPU work while a display is awake", mac_checks.check_display),
    Check("watchdog", MACOS, SETUP, "kernel panic reports of the last days (/Library/Logs/DiagnosticReports): a "
          "reboot under the GPU watchdog", mac_checks.check_watchdog),
    Check("power", MACOS, SETUP, "Low Power Mode, the power mode, AC or battery (pmset -g, pmset -g batt)",
          mac_checks.check_power),
    Check("thermal", MACOS, SETUP, "thermal and performance warnings (pmset -g therm)", mac_checks.check_thermal),
    Check("GPU load", MACOS, SETUP, "the GPU's utilization before the job (ioreg IOAccelerator): another program "
          "on it", mac_checks.check_gpu_load),
    Check("connections", EVERY, MEASURED, "every host connects to every other from the ranks' Python; a failure "
          "named with its cause (macOS Local Network privacy, a firewall)", check_connections),
    Check("speed", EVERY, MEASURED, "with --model and --batch: each host's samples/s on its training device; a Mac "
          f"below {SLOW_FRACTION:g} of the fleet's median named with its likely causes", check_speed),
)


def judge(host: str, probe: dict, addr: Optional[str] = None) -> List[Finding]:
    """Every setup finding for one host (whose hostfile `addr` is checked when given), in CHECKS' order."""
    probe = dict(probe, hostfile_addr=addr)
    found = []
    for check in CHECKS:
        if check.stage == SETUP and (check.hosts == EVERY or probe.get("system") == "Darwin"):
            finding = check.run(host, probe)
            if finding is not None:
                found.append(finding)
    return found


def path_fix(output: List[str]) -> Optional[str]:
    """What to do when a host's probe died on its path: the working directory or the Python is missing."""
    text = "\n".join(output)
    m = re.search(r"cannot change to the working directory (.+?): ", text)
    if m:
        return (f"every host needs the same absolute paths: put the project at {m.group(1)} on this host, "
                "or give --chdir DIR")
    if "command not found" in text or "No such file" in text:
        return "the Python is missing at that path on this host: install it there, or give --python PATH"
    return None
