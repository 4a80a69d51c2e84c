"""This host's TCP loss counters, to tell a slow step caused by lost packets from one caused by compute.

On Linux they are read from /proc/net/snmp and /proc/net/netstat, which belong to the reading process's network
namespace: under `mccl switch` each rank reads its own emulated host's. Elsewhere (macOS) there is no such
file and every counter reads 0.

    retrans_segs   segments sent again (Tcp RetransSegs)
    rto_timeouts   retransmission timeouts (TcpExt TCPTimeouts): each stalls its connection for >= 200 ms on Linux
    loss_probes    tail-loss probes sent (TcpExt TCPLossProbes)
    zero_windows   times this host's receiver closed its window (TcpExt TCPToZeroWindowAdv): the reading
                   thread fell behind, and the sender had to stop
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, Tuple

FIELDS = ("retrans_segs", "rto_timeouts", "loss_probes", "zero_windows")
_SOURCES = (("/proc/net/snmp", "Tcp", "RetransSegs"), ("/proc/net/netstat", "TcpExt", "TCPTimeouts"),
            ("/proc/net/netstat", "TcpExt", "TCPLossProbes"), ("/proc/net/netstat", "TcpExt", "TCPToZeroWindowAdv"))


def _table(path: str) -> Dict[Tuple[str, str], int]:
    """(section, name) -> value from a /proc/net file of 'Section: names' / 'Section: values' line pairs."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    out = {}
    for names, values in zip(lines[::2], lines[1::2]):
        section, _, names = names.partition(":")
        for name, value in zip(names.split(), values.partition(":")[2].split()):
            out[(section, name)] = int(value)
    return out


def read() -> Tuple[int, ...]:
    """The counters now, in FIELDS order (0 where this system does not report one)."""
    tables = {path: _table(path) for path in {s[0] for s in _SOURCES}}
    return tuple(tables[path].get((section, name), 0) for path, section, name in _SOURCES)


def columns(values: Iterable[float]) -> Dict[str, int]:
    """Counts in FIELDS order as result columns: tcp_retrans_segs, tcp_rto_timeouts, ..."""
    return {f"tcp_{f}": int(v) for f, v in zip(FIELDS, values)}


def host_id() -> int:
    """The network namespace this process is in (0 where there is none): ranks of one host share it, and
    only one of them should count its counters."""
    try:
        return os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return 0
