"""What `mccl doctor` asks each host about its setup: raw command outputs, analysed by `host_checks`.

Runs on every host inside doctor's probe (with the ranks' Python, their environment and working
directory), so, like the rank shim, it is standard library only and compatible with Python 3.10 (the
package's oldest). `collect` returns a JSON-able dict:

- ``system``: platform.system() ("Darwin" on a Mac);
- ``cwd``, ``executable``: where the ranks will run, with which Python; ``binary``: that Python's real file
  (the one a macOS firewall rule names; a virtual environment's python is a link to it);
- ``ifname``: MCCL_SOCKET_IFNAME as the rank will see it (the hostfile's ``ifname``), ``master``: MASTER_ADDR;
- ``route_addr``: the local address that routes to MASTER_ADDR (what the engine listens on without ifname);
- ``addresses``: [[interface, address]] of every address of the host (None: the ranks' Python has no
  lightning-mccl); ``gloo_ifname``: GLOO_SOCKET_IFNAME as the rank shim set it (see `host_net`);
- ``relax_watchdog``: AGX_RELAX_CDM_CTXSTORE_TIMEOUT as the ranks will see it (None: unset);
- ``commands``: {name: [exit code, output]} of the commands below (macOS ones only on macOS; None when the
  command is missing or did not answer in time);
- macOS only: ``now`` (this host's clock, seconds since the epoch) and ``panics``: [[file name, modified,
  excerpt]] of the kernel panic reports of the last PANIC_DAYS days in PANIC_DIR (the excerpt: the panic's
  own line, e.g. ``panic(cpu 4 caller ...): watchdog timeout: no checkins from watchdogd in 93 seconds``), or
  a string saying why the folder could not be read.

`run` is the command runner (a test passes canned outputs instead).
"""
import json
import os
import platform
import re
import subprocess
import sys
import time

SOCKETFILTERFW = "/usr/libexec/ApplicationFirewall/socketfilterfw"
PANIC_DIR = "/Library/Logs/DiagnosticReports"  # where macOS writes a kernel panic's report after the reboot
PANIC_DAYS = 7
EXCERPT_CHARS = 300
RELAX_VAR = "AGX_RELAX_CDM_CTXSTORE_TIMEOUT"  # Apple's GPU driver: relax its watchdog (opt-in: docs/macs.md)


def run_command(argv, timeout=10):
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [p.returncode, p.stdout.decode("utf-8", "replace")]


def commands_for(system, ifname, master, executable):
    """{name: argv} of what to ask this host."""
    if system == "Darwin":
        out = {
            "firewall": [SOCKETFILTERFW, "--getglobalstate"],
            "firewall_app": [SOCKETFILTERFW, "--getappblocked", executable],
            "blockall": [SOCKETFILTERFW, "--getblockall"],
            "stealth": [SOCKETFILTERFW, "--getstealthmode"],
            "pmset": ["pmset", "-g"],  # sleep, displaysleep, lowpowermode, powermode
            "therm": ["pmset", "-g", "therm"],  # thermal and performance warning levels
            "batt": ["pmset", "-g", "batt"],  # AC or battery power
            "assertions": ["pmset", "-g", "assertions"],  # what keeps the display awake; is it on
            "console": ["stat", "-f", "%Su", "/dev/console"],  # the user logged in at the screen; root: nobody
            "displays": ["system_profiler", "-json", "SPDisplaysDataType"],  # the GPU and the displays attached
            "gpu": ["ioreg", "-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"],  # GPU utilization now
            "chip": ["sysctl", "-n", "machdep.cpu.brand_string"],
            "macos": ["sw_vers", "-productVersion"],
            "boot": ["sysctl", "-n", "kern.boottime"],
            "xcode": ["xcode-select", "-p"],
            "ports": ["networksetup", "-listallhardwareports"],
        }
        if ifname:
            out["ifaddr"] = ["ipconfig", "getifaddr", ifname]
        elif master:
            out["route"] = ["route", "-n", "get", master]
        return out
    if ifname:
        return {"ifaddr": ["ip", "-o", "-4", "addr", "show", "dev", ifname]}
    return {"route": ["ip", "-o", "route", "get", master]} if master else {}


def panic_excerpt(text):
    """The panic's own line from a report's text: its JSON "panicString" (macOS 12 and later), else the text
    from ``panic(`` on; at most EXCERPT_CHARS characters."""
    m = re.search(r'"panicString"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
    if m:
        try:
            text = json.loads('"' + m.group(1) + '"')
        except ValueError:
            text = m.group(1)
    start = text.find("panic(")
    return " ".join(text[max(0, start):].split())[:EXCERPT_CHARS]


def panic_reports(folder=PANIC_DIR, now=None, days=PANIC_DAYS):
    """[[file name, modified, excerpt]] of the .panic reports in `folder` modified in the last `days` days,
    newest first; a string naming the error when the folder cannot be listed."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    except OSError as e:
        return f"cannot list {folder}: {e.strerror or e}"
    found = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            modified = os.path.getmtime(path)
            if not name.endswith(".panic") or now - modified > days * 86400:
                continue
            with open(path, "rb") as f:
                excerpt = panic_excerpt(f.read(1 << 20).decode("utf-8", "replace"))
        except OSError as e:
            excerpt = f"(unreadable: {e.strerror or e})"
        found.append([name, modified, excerpt])
    return sorted(found, key=lambda p: -p[1])


def _host_net():
    """lightning_mccl.launcher.host_net from the ranks' Python; None without lightning-mccl there (doctor then says
    it is not installed, and measures nothing)."""
    try:
        from lightning_mccl.launcher import host_net
    except ImportError:
        return None
    return host_net


def collect(run=run_command, system=None, environ=None, panic_dir=PANIC_DIR):
    environ = os.environ if environ is None else environ
    system = system or platform.system()
    ifname = environ.get("MCCL_SOCKET_IFNAME") or None
    master = environ.get("MASTER_ADDR") or None
    binary = os.path.realpath(sys.executable)
    net = _host_net()
    out = {"system": system, "cwd": os.getcwd(), "executable": sys.executable, "binary": binary, "ifname": ifname,
           "master": master, "route_addr": net.route_address(master) if net else None,
           "addresses": net.interface_addresses() if net else None, "gloo_ifname": environ.get("GLOO_SOCKET_IFNAME"),
           "relax_watchdog": environ.get(RELAX_VAR),
           "commands": {name: run(argv) for name, argv in commands_for(system, ifname, master, binary).items()}}
    if system == "Darwin":
        out["now"] = time.time()
        out["panics"] = panic_reports(panic_dir, out["now"])
    return out
