"""`mccl doctor`'s setup checks: what `host_probe` collected on a host, judged, each with the exact fix.

Every host: whether the hostfile's ``addr`` for it is one of its own addresses (its peers connect there;
host 0's is every rank's MASTER_ADDR), and which interface has it; the interface and address its ranks
will listen on (MCCL_SOCKET_IFNAME from the hostfile's ``ifname``, else the interface that routes to
MASTER_ADDR), and Lightning's Gloo groups with them (GLOO_SOCKET_IFNAME, `host_net`); the working directory
and Python they run with. macOS hosts also: the application firewall (ranks accept connections from their
peers; the prompt "accept incoming connections?" cannot be answered on a Mac reached over ssh), sleep (a
sleeping Mac drops out of the job and out of ssh), the Xcode command-line tools (needed to build
lightning-mccl), and whether the interface is Wi-Fi (slow, and variable: a fleet wants Ethernet or a
Thunderbolt bridge).

`CHECKS` declares them, in the order the table shows them (`mccl doctor --help` lists it); `judge(host, probe,
addr)` runs them and returns `Finding`s; `state` is ``ok``, ``warn`` (works, but see the fix) or ``fail`` (the job
will not run or will hang until it is fixed).
"""
from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from ..hostfile import resolve
from .host_probe import SOCKETFILTERFW

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    host: str
    check: str
    state: str
    detail: str
    fix: Optional[str] = None  # a command to run on that host, or what to change


def _output(probe: dict, name: str) -> Optional[tuple]:
    got = (probe.get("commands") or {}).get(name)
    return (got[0], got[1]) if got else None


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
    ports = hardware_ports(_output(probe, "ports")[1]) if _output(probe, "ports") else {}
    ifname = probe.get("ifname")
    if ifname:
        got = _output(probe, "ifaddr")
        addr = interface_address(got[1]) if got and got[0] == 0 else None
        if addr is None:
            choices = ", ".join(f"{d} ({n})" for d, n in ports.items()) or "see `ifconfig`"
            return Finding(host, "interface", FAIL, f"ifname {ifname} (MCCL_SOCKET_IFNAME) has no IPv4 address here",
                           f"set this host's ifname in the hostfile to a connected interface: {choices}")
        source = f"{ifname} (ifname)"
    else:
        got = _output(probe, "route")
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


def check_addr(host: str, probe: dict, addr: str) -> Optional[Finding]:
    """Whether `addr` (the hostfile's, resolved here) is one of this host's addresses, and on which interface;
    None when the probe could not list them (no lightning-mccl for the ranks' Python: reported as such)."""
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


def check_firewall(host: str, probe: dict) -> Finding:
    got = _output(probe, "firewall")
    if got is None:
        return Finding(host, "firewall", WARN, f"{SOCKETFILTERFW} did not answer", None)
    if "disabled" in got[1] or "State = 0" in got[1]:
        return Finding(host, "firewall", OK, "application firewall off")
    py = probe.get("binary") or probe.get("executable") or "PYTHON"
    allow = (f"sudo {SOCKETFILTERFW} --add {shlex.quote(py)} && sudo {SOCKETFILTERFW} --unblockapp {shlex.quote(py)}")
    app = _output(probe, "firewall_app")
    text = app[1] if app else ""
    if "permitted" in text:
        return Finding(host, "firewall", OK, f"application firewall on, {py} allowed")
    why = "blocks" if "blocked" in text else "has no rule for"
    return Finding(host, "firewall", FAIL, f"application firewall on and {why} {py}: peers cannot connect to "
                   "its ranks (the allow prompt cannot be answered over ssh)", allow)


def check_sleep(host: str, probe: dict) -> Finding:
    got = _output(probe, "pmset")
    m = re.search(r"^\s*sleep\s+(\d+)", got[1], re.M) if got else None
    if m is None:
        return Finding(host, "sleep", WARN, "`pmset -g` did not say", None)
    minutes = int(m.group(1))
    if minutes == 0:
        return Finding(host, "sleep", OK, "system sleep off")
    return Finding(host, "sleep", WARN, f"sleeps after {minutes} min idle (kept awake during a job by "
                   "--caffeinate, but a sleeping Mac is unreachable between jobs)", "sudo pmset -a sleep 0")


def check_xcode(host: str, probe: dict) -> Finding:
    got = _output(probe, "xcode")
    if got is not None and got[0] == 0 and got[1].strip():
        return Finding(host, "Xcode CLT", OK, got[1].strip())
    return Finding(host, "Xcode CLT", WARN, "command-line tools missing (needed to build lightning-mccl)",
                   "xcode-select --install")


EVERY_HOST, MACOS = "every host", "macOS"


@dataclass(frozen=True)
class HostCheck:
    """One check of `mccl doctor`'s Host setup table."""

    name: str  # the table's "check" column
    hosts: str  # EVERY_HOST, or MACOS: macOS hosts only
    what: str  # what it checks, for `mccl doctor --help`
    run: Callable[[str, dict, Optional[str]], Optional[Finding]]  # (host, probe, its hostfile addr or None)


def _host_only(check: Callable[[str, dict], Finding]) -> Callable[[str, dict, Optional[str]], Finding]:
    """A check that needs no hostfile addr, as a HostCheck runs it."""
    return lambda host, probe, addr: check(host, probe)


# Every check, in the order the table shows them; `mccl doctor --help` lists them from here.
CHECKS = (
    HostCheck("addr", EVERY_HOST, "the hostfile's addr is one of the host's own addresses, and on which interface",
              lambda host, probe, addr: check_addr(host, probe, addr) if addr else None),
    HostCheck("interface", EVERY_HOST, "the interface and address its ranks listen on (ifname, else the route to "
              "host 0), Lightning's Gloo groups with them; Wi-Fi is warned", _host_only(check_interface)),
    HostCheck("path", EVERY_HOST, "the working directory and the Python the ranks run with", _host_only(check_path)),
    HostCheck("firewall", MACOS, "the application firewall lets the ranks' Python accept its peers' connections",
              _host_only(check_firewall)),
    HostCheck("sleep", MACOS, "system sleep when idle (pmset)", _host_only(check_sleep)),
    HostCheck("Xcode CLT", MACOS, "the Xcode command-line tools (to build lightning-mccl)", _host_only(check_xcode)),
)


def judge(host: str, probe: dict, addr: Optional[str] = None) -> List[Finding]:
    """Every finding for one host (whose hostfile `addr` is checked when given), in the order the table shows
    them."""
    darwin = probe.get("system") == "Darwin"
    found = (c.run(host, probe, addr) for c in CHECKS if c.hosts == EVERY_HOST or darwin)
    return [f for f in found if f is not None]


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
