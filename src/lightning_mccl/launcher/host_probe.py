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
- ``commands``: {name: [exit code, output]} of the commands below (macOS ones only on macOS; None when the
  command is missing).

`run` is the command runner (a test passes canned outputs instead).
"""
import os
import platform
import subprocess
import sys

SOCKETFILTERFW = "/usr/libexec/ApplicationFirewall/socketfilterfw"


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
            "pmset": ["pmset", "-g"],
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


def _host_net():
    """lightning_mccl.launcher.host_net from the ranks' Python; None without lightning-mccl there (doctor then says
    it is not installed, and measures nothing)."""
    try:
        from lightning_mccl.launcher import host_net
    except ImportError:
        return None
    return host_net


def collect(run=run_command, system=None, environ=None):
    environ = os.environ if environ is None else environ
    system = system or platform.system()
    ifname = environ.get("MCCL_SOCKET_IFNAME") or None
    master = environ.get("MASTER_ADDR") or None
    binary = os.path.realpath(sys.executable)
    net = _host_net()
    return {"system": system, "cwd": os.getcwd(), "executable": sys.executable, "binary": binary, "ifname": ifname,
            "master": master, "route_addr": net.route_address(master) if net else None,
            "addresses": net.interface_addresses() if net else None, "gloo_ifname": environ.get("GLOO_SOCKET_IFNAME"),
            "commands": {name: run(argv) for name, argv in commands_for(system, ifname, master, binary).items()}}
