"""`mccl doctor`'s setup checks: what `host_probe` collected on a host, judged, each with the exact fix.

Every host: the interface and address its ranks will listen on (MCCL_SOCKET_IFNAME from the hostfile's
``ifname``, else the interface that routes to MASTER_ADDR) and the working directory and Python they run
with. macOS hosts also: the application firewall (ranks accept connections from their peers; the prompt
"accept incoming connections?" cannot be answered on a Mac reached over ssh), sleep (a sleeping Mac drops
out of the job and out of ssh), the Xcode command-line tools (needed to build lightning-mccl), and whether
the interface is Wi-Fi (slow, and variable: a fleet wants Ethernet or a Thunderbolt bridge).

`judge(host, probe)` returns `Finding`s; `state` is ``ok``, ``warn`` (works, but see the fix) or ``fail``
(the job will not run or will hang until it is fixed).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Dict, List, Optional

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
    if kind and "wi-fi" in kind.lower():
        wired = _wired(ports)
        fix = (f"connect Ethernet and set `ifname: {wired[0]}` ({ports[wired[0]]}) for {host} in the hostfile"
               if wired else "connect an Ethernet adapter (or a Thunderbolt cable) and set its `ifname` in the hostfile")
        return Finding(host, "interface", WARN, detail + ": Wi-Fi is slow and drops packets", fix)
    return Finding(host, "interface", OK, detail)


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


def judge(host: str, probe: dict) -> List[Finding]:
    """Every finding for one host, in the order the table shows them."""
    found = [check_interface(host, probe), check_path(host, probe)]
    if probe.get("system") == "Darwin":
        found += [check_firewall(host, probe), check_sleep(host, probe), check_xcode(host, probe)]
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
