"""The `ip` and `tc` commands the switch emulator runs, with errors that say what failed and why.

Everything here shells out to iproute2 (``ip``, ``tc``), looked up on PATH and then in /usr/sbin and /sbin
(where distributions put them, often outside a non-root PATH). Nothing is cached: every call is one command.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import List, Optional, Sequence

SBIN_DIRS = ("/usr/sbin", "/sbin", "/usr/local/sbin")
COMMAND_TIMEOUT_S = 30.0  # one ip/tc command


class SwitchError(RuntimeError):
    """The emulated switch could not be set up, used or taken down; the message names the command and cause."""


def find_tool(name: str) -> str:
    """Absolute path of `name` (``ip``/``tc``): PATH first, then the sbin directories."""
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN_DIRS:
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    raise SwitchError(f"`{name}` not found (looked on PATH and in {', '.join(SBIN_DIRS)}): the switch emulator "
                      f"needs iproute2 (Debian/Ubuntu: apt-get install iproute2)")


CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


def _missing_caps() -> List[str]:
    """Capabilities the emulator needs that this process lacks: CAP_NET_ADMIN (links, addresses, qdiscs) and
    CAP_SYS_ADMIN (`ip netns add` bind-mounts the namespace under /run/netns)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    eff = int(line.split()[1], 16)
                    return [name for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
                            if not eff & (1 << bit)]
    except (OSError, ValueError):
        pass
    return [] if os.geteuid() == 0 else ["CAP_NET_ADMIN", "CAP_SYS_ADMIN"]


def privilege_problem() -> Optional[str]:
    """Why this process cannot build an emulated switch (None: it can)."""
    if not os.path.isdir("/proc/self/ns") or os.uname().sysname != "Linux":
        return "the switch emulator needs Linux network namespaces (this is not Linux)"
    for tool in ("ip", "tc"):
        try:
            find_tool(tool)
        except SwitchError as e:
            return str(e)
    missing = _missing_caps()
    if missing:
        return (f"the switch emulator needs root ({' and '.join(missing)} missing) to create network namespaces, "
                f"links and qdiscs: run it with sudo")
    return None


def require_privileges() -> None:
    problem = privilege_problem()
    if problem:
        raise SwitchError(problem)


def timed_out(e: subprocess.TimeoutExpired, what: str = "") -> SwitchError:
    """The SwitchError for a command that ran past its timeout: what was being done and the command (the
    emulator's commands are ip, tc, iperf3 and tcp_probe with addresses and ports: nothing secret)."""
    command = e.cmd if isinstance(e.cmd, str) else " ".join(map(str, e.cmd))
    return SwitchError(f"{what + ': ' if what else ''}`{command}` did not finish within {e.timeout:g} s")


def run(argv: Sequence[str], *, check: bool = True, what: str = "") -> subprocess.CompletedProcess:
    """Runs one ``ip``/``tc`` command (first word: the tool's name). check: raise SwitchError on failure,
    naming `what` was being done, the command and its stderr; SwitchError too after COMMAND_TIMEOUT_S."""
    argv = [find_tool(argv[0])] + list(argv[1:])
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise timed_out(e, what) from None
    if check and proc.returncode != 0:
        err = proc.stderr.strip() or proc.stdout.strip() or f"exit code {proc.returncode}"
        hint = _hint(err)
        raise SwitchError(f"{what + ': ' if what else ''}`{' '.join(argv)}` failed: {err}{hint}")
    return proc


def _hint(err: str) -> str:
    low = err.lower()
    if "operation not permitted" in low:
        return " (needs root or CAP_NET_ADMIN)"
    if "specified qdisc kind is unknown" in low or "unknown qdisc" in low:
        return " (this kernel lacks that qdisc module: check `modprobe sch_tbf` / `sch_htb`)"
    if "file exists" in low:
        return " (left over from an earlier run? `mccl switch down --tag TAG` removes it)"
    return ""


def netns_list() -> List[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    out = run(["ip", "netns", "list"], what="listing network namespaces").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def link_names() -> List[str]:
    """Names of the links in this (the root) network namespace."""
    out = run(["ip", "-o", "link", "show"], what="listing links").stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def exec_argv(ns: str, argv: Sequence[str]) -> List[str]:
    """`argv` run inside the network namespace `ns`."""
    return [find_tool("ip"), "netns", "exec", ns, *argv]
