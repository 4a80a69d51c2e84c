"""`SwitchFleet`: N emulated hosts on one emulated Ethernet switch, to plan a fleet before buying it.

    with SwitchFleet(hosts=4, rate="1gbit") as fleet:          # needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)
        argv = fleet.exec_argv(2, ["python", "train.py"])       # runs "on host 2"
        fleet.host_ip(0), fleet.ifname                          # MASTER_ADDR, MCCL_SOCKET_IFNAME

What it builds (names carry the tag, so instances never collide and `down` removes only its own things):

    netns mccl-<tag>-h<i>      host i: loopback up, one interface `mccl0` with 10.213.<k>.<i+1>/24
    veth  mc-<tag>-<i>         host i's cable: the other end of `mccl0`, in the root namespace
    bridge mc-<tag>-br         the switch: every cable plugged in, no address, host firewall bypassed

Each cable is shaped in both directions with tbf at `rate`: on `mccl0` (traffic the host sends) and on
`mc-<tag>-<i>` (traffic the switch delivers to the host), so every host has a full-duplex port of that speed
and the switch itself is non-blocking, as a real one is. No address is added to the root namespace: traffic
only flows between the namespaces built here.

Each host's TCP uses the congestion control `congestion` (default cubic: macOS's, and most Linux
distributions'), set in its namespace, whatever the machine's own default is. Machines that default to BBR
(the GPU host does) would otherwise give every emulated host BBR, whose periodic round-trip probe (a flow's
window cut to 4 packets for 200 ms, every 10 s) slows a ring now and then (by how much:
benchmarks/record/performance.md, *Why the emulated hosts run cubic*). `congestion="system"` (or None) keeps
the machine's default. A namespace may only default to an algorithm of the machine's tcp_allowed_congestion_control
(those unprivileged programs may pick), so `up()` adds the named one there when it is missing.

Not emulated: latency and loss. These kernels have no `netem` qdisc, so links have veth latency (microseconds),
not the 50-200 us of real copper and switch hops; small-message times measured here are therefore optimistic.
"""
from __future__ import annotations

import json
import re
import secrets
import time
from typing import List, Optional, Sequence

from . import netns, rates, state
from .netns import SwitchError

IFNAME = "mccl0"
SUBNET_PREFIX = "10.213"
DEFAULT_TAG = "fleet"
# Link names are limited to 15 characters: "mc-" + tag + "-" + 3 digits.
_TAG = re.compile(r"^[a-z0-9]{1,7}$")
MAX_HOSTS = 254
DEFAULT_QUEUE_MS = 10.0
DEFAULT_CONGESTION = "cubic"  # the hosts' TCP congestion control: what a Mac's TCP runs (docstring)
SYSTEM_CONGESTION = "system"  # the machine's own default instead


def _sysctl_path(name: str) -> str:
    return f"/proc/sys/net/ipv4/{name}"


def _read_sysctl(name: str) -> str:
    try:
        with open(_sysctl_path(name)) as f:
            return f.read().strip()
    except OSError:
        return ""


def validate_tag(tag: str) -> str:
    if not _TAG.match(tag or ""):
        raise ValueError(f"switch tag {tag!r}: use 1-7 lowercase letters or digits (it goes into link names, "
                         f"which Linux limits to 15 characters)")
    return tag


def random_tag() -> str:
    """A fresh tag for a throwaway switch (tests, benchmarks): 't' + 6 hex digits."""
    return "t" + secrets.token_hex(3)


class SwitchFleet:
    """See the module docstring. `up()`/`down()` or a `with` block; `attach(tag)` finds one already up."""

    def __init__(self, hosts: int, rate: str = "1gbit", *, tag: str = DEFAULT_TAG, burst: Optional[str] = None,
                 queue_ms: float = DEFAULT_QUEUE_MS, state_dir: Optional[str] = None, subnet: Optional[int] = None,
                 congestion: Optional[str] = DEFAULT_CONGESTION):
        if not 1 <= int(hosts) <= MAX_HOSTS:
            raise ValueError(f"hosts={hosts}: the emulated switch takes 1 to {MAX_HOSTS} hosts")
        self.hosts = int(hosts)
        self.tag = validate_tag(tag)
        self.rate_bps = rates.parse_rate(rate)
        self.burst_bytes = rates.parse_size(burst) if burst is not None else rates.default_burst(self.rate_bps)
        if self.burst_bytes < 1600:
            raise ValueError(f"burst {burst!r}: must hold at least one 1514-byte frame")
        if queue_ms <= 0:
            raise ValueError(f"queue_ms={queue_ms}: must be positive")
        self.queue_ms = float(queue_ms)
        if congestion == SYSTEM_CONGESTION:
            congestion = None
        if congestion is not None and not re.fullmatch(r"[a-z0-9_]{1,15}", congestion):
            raise ValueError(f"congestion={congestion!r}: a Linux TCP congestion control name, e.g. cubic, reno, bbr")
        self.congestion = congestion
        self.state_dir = state_dir
        self.subnet = subnet  # the <k> of 10.213.<k>.0/24, chosen by up() when None
        self.ifname = IFNAME
        self._up = False

    # -- names and addresses ------------------------------------------------------------------------------

    def netns(self, i: int) -> str:
        return f"mccl-{self.tag}-h{self._index(i)}"

    def veth(self, i: int) -> str:
        return f"mc-{self.tag}-{self._index(i)}"

    @property
    def bridge(self) -> str:
        return f"mc-{self.tag}-br"

    def host_ip(self, i: int) -> str:
        if self.subnet is None:
            raise SwitchError(f"switch {self.tag!r} is not up: no addresses yet")
        return f"{SUBNET_PREFIX}.{self.subnet}.{self._index(i) + 1}"

    def exec_argv(self, i: int, argv: Sequence[str]) -> List[str]:
        """`argv` run on host i (inside its network namespace; same user, files and environment)."""
        return netns.exec_argv(self.netns(i), argv)

    @property
    def rate(self) -> str:
        return rates.format_rate(self.rate_bps)

    def _index(self, i: int) -> int:
        if not 0 <= int(i) < self.hosts:
            raise ValueError(f"host {i}: switch {self.tag!r} has hosts 0..{self.hosts - 1}")
        return int(i)

    def describe(self) -> str:
        sub = f", {SUBNET_PREFIX}.{self.subnet}.0/24" if self.subnet is not None else ""
        tcp = f", TCP {self.congestion}" if self.congestion else ""
        return (f"switch {self.tag!r}: {self.hosts} hosts at {self.rate} full duplex "
                f"(tbf burst {self.burst_bytes // 1000} KB, queue {self.queue_ms:g} ms{tcp}{sub})")

    # -- up / down ----------------------------------------------------------------------------------------

    def up(self) -> "SwitchFleet":
        """Builds the switch; on any failure removes what it made and raises SwitchError."""
        netns.require_privileges()
        with state.locked(self.state_dir):
            if state.read(self.tag, self.state_dir) is not None:
                raise SwitchError(f"switch {self.tag!r} is already up (see `mccl switch status`); take it down "
                                  f"with `mccl switch down --tag {self.tag}` or pick another --tag")
            leftovers = self._existing()
            if leftovers:
                raise SwitchError(f"switch {self.tag!r}: {', '.join(leftovers)} already exist (left over from "
                                  f"a crashed run?); `mccl switch down --tag {self.tag}` removes them")
            if self.subnet is None:
                used = {r.get("subnet") for r in state.all_records(self.state_dir).values()}
                self.subnet = next((k for k in range(256) if k not in used), None)
                if self.subnet is None:
                    raise SwitchError("all 256 subnets 10.213.0-255.0/24 are taken by running switches")
            # Recorded before anything is built, so that `down` from another process can clean up after a crash.
            state.write(self.tag, self.record(), self.state_dir)
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        self._up = True
        return self

    def _build(self) -> None:
        run = netns.run
        run(["ip", "link", "add", self.bridge, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0",
             "nf_call_arptables", "0"], what=f"creating the switch {self.bridge}")
        run(["ip", "link", "set", self.bridge, "up"], what="bringing the switch up")
        if self.congestion:
            self._allow_congestion()
        for i in range(self.hosts):
            ns, veth, ip = self.netns(i), self.veth(i), self.host_ip(i)
            what = f"host {i} ({ns})"
            run(["ip", "netns", "add", ns], what=what)
            run(["ip", "-n", ns, "link", "set", "lo", "up"], what=what)
            if self.congestion:
                self._set_congestion(ns, what)
            run(["ip", "link", "add", veth, "type", "veth", "peer", "name", IFNAME, "netns", ns], what=what)
            run(["ip", "link", "set", veth, "master", self.bridge], what=what)
            run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", IFNAME], what=what)
            run(["ip", "link", "set", veth, "up"], what=what)
            run(["ip", "-n", ns, "link", "set", IFNAME, "up"], what=what)
            # from the host: its own interface's egress; to the host: the switch port's egress
            run(["tc", "-n", ns, "qdisc", "add", "dev", IFNAME, "root", *self._tbf()], what=f"{what}: shaping")
            run(["tc", "qdisc", "add", "dev", veth, "root", *self._tbf()], what=f"{what}: shaping")

    def _allow_congestion(self) -> None:
        """A namespace may default only to an algorithm in the machine's tcp_allowed_congestion_control (the
        ones unprivileged programs may pick): the named one is added there when the kernel has it."""
        allowed = _read_sysctl("tcp_allowed_congestion_control").split()
        available = _read_sysctl("tcp_available_congestion_control").split()
        if self.congestion in allowed or self.congestion not in available:
            return
        try:
            with open(_sysctl_path("tcp_allowed_congestion_control"), "w") as f:
                f.write(" ".join(allowed + [self.congestion]))
        except OSError:
            pass  # _set_congestion says what is wrong

    def _set_congestion(self, ns: str, what: str) -> None:
        """The namespace's default TCP congestion control (a per-namespace sysctl, written from inside it)."""
        path = _sysctl_path("tcp_congestion_control")
        done = netns.run(["ip", "netns", "exec", ns, "sh", "-c", f"echo {self.congestion} > {path}; cat {path}"],
                         check=False, what=what)
        if done.returncode != 0 or done.stdout.strip() != self.congestion:
            raise SwitchError(f"{what}: cannot set TCP congestion control {self.congestion!r} "
                              f"({(done.stderr or done.stdout).strip() or 'not taken'}); this kernel has "
                              f"{_read_sysctl('tcp_available_congestion_control') or 'none listed'}, of which "
                              f"namespaces may use {_read_sysctl('tcp_allowed_congestion_control') or 'none'}: "
                              f"pass another (--congestion NAME), or --congestion system to keep the machine's "
                              f"default")

    def _tbf(self) -> List[str]:
        return ["tbf", "rate", f"{self.rate_bps}bit", "burst", str(self.burst_bytes),
                "latency", f"{self.queue_ms:g}ms"]

    def down(self) -> List[str]:
        """Removes everything this tag's switch has (whoever made it): safe to call twice. Returns what it removed."""
        removed = []
        links = set(netns.link_names())
        mine = re.compile(rf"^mc-{re.escape(self.tag)}-(\d+|br)$")
        for name in sorted(n for n in links if mine.match(n)):
            if netns.run(["ip", "link", "del", name], check=False).returncode == 0:
                removed.append(name)
        ns_re = re.compile(rf"^mccl-{re.escape(self.tag)}-h\d+$")
        for ns in sorted(n for n in netns.netns_list() if ns_re.match(n)):
            netns.run(["ip", "netns", "del", ns], what=f"removing {ns}")
            removed.append(ns)
        state.remove(self.tag, self.state_dir)
        self._up = False
        return removed

    def _existing(self) -> List[str]:
        ns_re = re.compile(rf"^mccl-{re.escape(self.tag)}-h\d+$")
        link_re = re.compile(rf"^mc-{re.escape(self.tag)}-(\d+|br)$")
        return ([n for n in netns.netns_list() if ns_re.match(n)]
                + [n for n in netns.link_names() if link_re.match(n)])

    def __enter__(self) -> "SwitchFleet":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- state ----------------------------------------------------------------------------------------------

    def record(self) -> dict:
        return {"tag": self.tag, "hosts": self.hosts, "rate_bps": self.rate_bps, "burst_bytes": self.burst_bytes,
                "queue_ms": self.queue_ms, "subnet": self.subnet, "ifname": self.ifname,
                "congestion": self.congestion,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S")}

    @classmethod
    def attach(cls, tag: str = DEFAULT_TAG, state_dir: Optional[str] = None) -> "SwitchFleet":
        """The switch `tag` that some process brought up; SwitchError if there is none."""
        record = state.read(validate_tag(tag), state_dir)
        if record is None:
            raise SwitchError(f"no switch {tag!r} is up (`mccl switch up --tag {tag}` makes one; "
                              f"`mccl switch status` lists them)")
        fleet = cls(record["hosts"], f"{record['rate_bps']}bit", tag=tag, burst=str(record["burst_bytes"]),
                    queue_ms=record["queue_ms"], state_dir=state_dir, subnet=record["subnet"],
                    congestion=record.get("congestion"))
        fleet._up = True
        return fleet

    def health(self) -> List[str]:
        """What is missing from a switch that should be up (empty: all there)."""
        have_ns, have_links = set(netns.netns_list()), set(netns.link_names())
        missing = [n for n in [self.bridge] + [self.veth(i) for i in range(self.hosts)] if n not in have_links]
        missing += [self.netns(i) for i in range(self.hosts) if self.netns(i) not in have_ns]
        return missing

    def qdiscs(self, i: int) -> dict:
        """tc's statistics for host i's two shaped directions (bytes, packets, drops, overlimits)."""
        out = {}
        for direction, argv in (("from_host", ["tc", "-j", "-s", "-n", self.netns(i), "qdisc", "show", "dev", IFNAME]),
                                ("to_host", ["tc", "-j", "-s", "qdisc", "show", "dev", self.veth(i)])):
            shown = json.loads(netns.run(argv, what=f"reading host {i}'s qdisc").stdout or "[]")
            tbf = next((q for q in shown if q.get("kind") == "tbf"), {})
            out[direction] = {k: tbf.get(k) for k in ("bytes", "packets", "drops", "overlimits")}
        return out
