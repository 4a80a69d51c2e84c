"""A fleet of Macs, described in one file that every Mac reads.

    # fleet.yaml
    master_port: 29500            # optional
    hosts:
      - name: studio-01           # what `ssh` connects to
        addr: 10.0.0.11           # data-plane IP the ranks use (the fast Ethernet, not Wi-Fi)
        ifname: en0               # optional: MCCL_SOCKET_IFNAME on that host
      - name: studio-02
        addr: 10.0.0.12

JSON with the same keys works too. Host i is node rank i; host 0 runs the rendezvous (MASTER_ADDR).
`addr` is an IP address or a name that resolves to one; `check_addresses` says which entries are neither
(`mccl launch` and `mccl doctor` call it before they start anything).
Each Mac finds its own node rank by matching its interface addresses against `addr` (or from the first of
NODE_RANK_VARS that is set: MCCL_NODE_RANK, NODE_RANK, torchrun's GROUP_RANK), so the same command line runs
unchanged on every host.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence


# The variables that say this host's node rank, in order of precedence; set, they win over the hostfile's addrs.
NODE_RANK_VARS = ("MCCL_NODE_RANK", "NODE_RANK", "GROUP_RANK")
# How long check_addresses waits for the hostfile's names to resolve (all at once), seconds.
RESOLVE_TIMEOUT_S = 3.0
# A host name (RFC 1123 labels); its last label is not all digits, else it is a mistyped IPv4 address.
_HOST_NAME = re.compile(r"(?=.{1,253}$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.)*"
                        r"(?![0-9]+\.?$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?")


class HostfileError(ValueError):
    """A hostfile that cannot be used, or a host that cannot place itself in one."""


@dataclass(frozen=True)
class Host:
    name: str
    addr: str
    ifname: Optional[str] = None


@dataclass(frozen=True)
class Hostfile:
    hosts: tuple
    master_port: int = 29500
    path: str = "<memory>"
    lines: tuple = ()  # the line of the file each host's entry starts on (1-based); empty when unknown

    def where(self, i: int) -> str:
        """Host i's entry, for messages: "fleet.yaml:4: hosts[1] (studio-02)"."""
        line = f":{self.lines[i]}" if i < len(self.lines) else ""
        return f"{self.path}{line}: hosts[{i}] ({self.hosts[i].name})"

    @property
    def num_nodes(self) -> int:
        return len(self.hosts)

    @property
    def master_addr(self) -> str:
        return self.hosts[0].addr


def _parse_text(text: str, path: str):
    stripped = text.lstrip()
    if stripped.startswith("{") or stripped.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise HostfileError(f"{path}: not valid JSON: {e}") from None
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML ships with Lightning
        raise HostfileError(f"{path}: reading YAML hostfiles needs PyYAML (pip install pyyaml), or use JSON") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise HostfileError(f"{path}: not valid YAML: {e}") from None


def _host_lines(text: str) -> tuple:
    """The line each entry of the `hosts` list starts on (1-based), from YAML's node marks (JSON is YAML
    too); empty when the text does not say."""
    try:
        import yaml

        node = yaml.compose(text)
    except Exception:  # no PyYAML, or text that only json reads: messages then name no line
        return ()
    if isinstance(node, yaml.MappingNode):
        node = next((v for k, v in node.value if k.value == "hosts"), None)
    if not isinstance(node, yaml.SequenceNode):
        return ()
    return tuple(item.start_mark.line + 1 for item in node.value)


def parse_hostfile(data, path: str = "<memory>", lines: tuple = ()) -> Hostfile:
    """Validates already-loaded YAML/JSON data (a mapping with `hosts`, or a bare list of hosts); `lines`:
    where each host's entry starts in the file (see `Hostfile.lines`)."""
    if isinstance(data, list):
        data = {"hosts": data}
    if not isinstance(data, dict) or "hosts" not in data:
        raise HostfileError(f"{path}: expected a mapping with a 'hosts' list")
    unknown = set(data) - {"hosts", "master_port"}
    if unknown:
        raise HostfileError(f"{path}: unknown key(s) {sorted(unknown)}; allowed: hosts, master_port")
    raw_hosts = data["hosts"]
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise HostfileError(f"{path}: 'hosts' must be a non-empty list")
    hosts = []
    for i, raw in enumerate(raw_hosts):
        if isinstance(raw, str):
            raw = {"name": raw, "addr": raw}
        if not isinstance(raw, dict):
            raise HostfileError(f"{path}: hosts[{i}] must be a mapping with 'name' and 'addr'")
        extra = set(raw) - {"name", "addr", "ifname"}
        if extra:
            raise HostfileError(f"{path}: hosts[{i}] has unknown key(s) {sorted(extra)}; allowed: name, addr, ifname")
        name = raw.get("name") or raw.get("addr")
        addr = raw.get("addr") or raw.get("name")
        if not name or not isinstance(name, str) or not isinstance(addr, str):
            raise HostfileError(f"{path}: hosts[{i}] needs 'name' (ssh host) and/or 'addr' (data-plane IP)")
        ifname = raw.get("ifname")
        if ifname is not None and not isinstance(ifname, str):
            raise HostfileError(f"{path}: hosts[{i}].ifname must be a string")
        hosts.append(Host(name=name, addr=addr, ifname=ifname))
    for key in ("name", "addr"):
        seen = {}
        for i, h in enumerate(hosts):
            value = getattr(h, key)
            if value in seen:
                raise HostfileError(f"{path}: hosts[{seen[value]}] and hosts[{i}] have the same {key} {value!r}")
            seen[value] = i
    port = data.get("master_port", 29500)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise HostfileError(f"{path}: master_port must be an integer port, got {port!r}")
    return Hostfile(hosts=tuple(hosts), master_port=port, path=path,
                    lines=tuple(lines) if len(lines) == len(hosts) else ())


def load_hostfile(path) -> Hostfile:
    """Reads a YAML or JSON hostfile. Raises HostfileError naming the file and the problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise HostfileError(f"cannot read hostfile {path}: {e.strerror}") from None
    return parse_hostfile(_parse_text(text, str(p)), str(p), _host_lines(text))


def local_addresses() -> set:
    """IP addresses of this machine's interfaces, from getifaddrs() (loopback included)."""
    from . import _C

    return {addr.split("%")[0] for _, addr in _C.interfaces()}


def resolve(addr: str) -> set:
    """The IP addresses `addr` stands for: itself when it is one, else what the name resolves to here (an
    empty set when it does not)."""
    if _is_ip(addr):
        return {addr}
    try:
        return {info[4][0] for info in socket.getaddrinfo(addr, None)}
    except OSError:
        return set()


def address_problem(addr: str) -> Optional[str]:
    """Why `addr` cannot be an address peers connect to without looking it up (not an IP address, and not
    a host name either), or None."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        if re.fullmatch(r"[0-9.]+", addr):
            try:
                ipaddress.IPv4Address(addr)
            except ValueError as e:  # says which octet, or how many there are
                return f"is not an IPv4 address ({e})"
        if not _HOST_NAME.fullmatch(addr):
            return "is neither an IP address nor a host name"
        return None
    if ip.is_unspecified or ip.is_multicast:
        return f"is {'the unspecified' if ip.is_unspecified else 'a multicast'} address, which no peer can connect to"
    return None


def check_addresses(hostfile: Hostfile, timeout: float = RESOLVE_TIMEOUT_S) -> None:
    """Every host's `addr` is an IP address, or a name that resolves here within `timeout` seconds (the
    names are looked up at once, each in a thread of its own). Raises HostfileError with one line per bad
    entry, each naming the file, the line and the host."""
    problems = {i: address_problem(h.addr) for i, h in enumerate(hostfile.hosts)}
    names = {i: h.addr for i, h in enumerate(hostfile.hosts) if problems[i] is None and not _is_ip(h.addr)}
    failed = {}

    def look_up(i: int, name: str) -> None:
        try:
            socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
            failed[i] = None
        except OSError as e:
            failed[i] = e.strerror or str(e)

    threads = [threading.Thread(target=look_up, args=item, daemon=True) for item in names.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for i in names:
        if i not in failed:
            problems[i] = f"does not resolve here within {timeout:g} s"
        elif failed[i] is not None:
            problems[i] = f"does not resolve here ({failed[i]})"
    lines = [f"{hostfile.where(i)}: addr {hostfile.hosts[i].addr!r} {why}" for i, why in problems.items() if why]
    if lines:
        raise HostfileError("\n".join(lines + ["each host's addr must be the IP address (or a name that resolves to "
                                                "it) its peers reach it at, e.g. 10.0.0.12"]))


def _is_ip(addr: str) -> bool:
    try:
        ipaddress.ip_address(addr)
        return True
    except ValueError:
        return False


def find_node_rank(hostfile: Hostfile, env: Optional[Mapping[str, str]] = None,
                   addresses: Optional[Sequence[str]] = None) -> int:
    """This host's node rank: the first of NODE_RANK_VARS that is set, else the one host whose `addr`
    is one of this machine's addresses. Raises HostfileError when none or several match."""
    env = os.environ if env is None else env
    for var in NODE_RANK_VARS:
        if env.get(var, "") != "":
            try:
                rank = int(env[var])
            except ValueError:
                raise HostfileError(f"{var}={env[var]!r} is not an integer") from None
            if not 0 <= rank < hostfile.num_nodes:
                raise HostfileError(f"{var}={rank} is outside the {hostfile.num_nodes} hosts of {hostfile.path}")
            return rank
    mine = set(addresses) if addresses is not None else local_addresses()
    matches = [i for i, h in enumerate(hostfile.hosts) if resolve(h.addr) & mine]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        listed = ", ".join(f"{h.name}={h.addr}" for h in hostfile.hosts)
        raise HostfileError(
            f"this machine ({socket.gethostname()}, addresses {sorted(mine)}) is none of the hosts in "
            f"{hostfile.path} ({listed}); fix the hostfile's addr entries or set MCCL_NODE_RANK")
    names = ", ".join(hostfile.hosts[i].name for i in matches)
    raise HostfileError(f"this machine matches several hosts in {hostfile.path} ({names}); set MCCL_NODE_RANK")
