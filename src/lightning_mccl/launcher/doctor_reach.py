"""Whether every rank of `mccl doctor`'s measurement can open a TCP connection to every other, from the ranks'
own Python, before the measurement's process group needs it (`doctor_bench`, one rank a host).

macOS's Local Network privacy and its application firewall judge the Python that connects, not the terminal it
was started from, and a denial there shows up later as a rendezvous or connect timeout that names nothing. Here:

1. `reach_master`, before the rendezvous (ranks > 0): a plain connect to MASTER_ADDR:MASTER_PORT, retried
   while rank 0's store is not up yet (refused); "No route to host" (EHOSTUNREACH: what Local Network privacy
   answers) or "Network is unreachable" that persists for REACH_TIMEOUT_S is a failure at once, not after the
   group timeout;
2. `reach_all`, after it: every rank listens on a port of its own (inside MCCL_PORT_RANGE where set) on the
   address the engine listens on (the interface of MCCL_SOCKET_IFNAME, else the one that routes to MASTER_ADDR),
   posts it in the store, connects to every other rank's at once (REACH_TIMEOUT_S each), posts what failed,
   and reads everyone's: every rank returns the same list.

A failure is ``{"from": rank, "to": rank, "addr": "host:port", "kind": "EHOSTUNREACH" | "ECONNREFUSED" |
"timeout" | ..., "error": "No route to host"}``; `fleet_checks.check_connections` names the likely cause.
Standard library only, and the store's set/get/wait.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Mapping, Optional, Tuple

from . import host_net

REACH_TIMEOUT_S = 5.0
RETRY_S = 0.2
KEY = "mccl/doctor/reach/"
UNREACHABLE = (errno.EHOSTUNREACH, errno.ENETUNREACH)


def attempt(addr: str, port: int, timeout: float) -> Optional[Tuple[str, str]]:
    """(kind, error) of a failed TCP connect to addr:port, or None when it connected."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return None
    except socket.timeout:
        return "timeout", f"no answer within {timeout:g} s"
    except OSError as e:
        kind = errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else type(e).__name__
        return kind, e.strerror or str(e)


def reach_master(rank: int, environ: Mapping[str, str] = os.environ,
                 timeout: float = REACH_TIMEOUT_S) -> Optional[dict]:
    """A failure (module docstring) when MASTER_ADDR:MASTER_PORT stays unreachable for `timeout` seconds; None
    once it connects, or is merely refused (rank 0 not listening yet: the rendezvous waits for it)."""
    addr, port = environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    deadline = time.monotonic() + timeout
    while True:
        got = attempt(addr, port, max(0.1, deadline - time.monotonic()))
        if got is None or got[0] not in [errno.errorcode[e] for e in UNREACHABLE]:
            return None
        if time.monotonic() >= deadline:
            return {"from": rank, "to": 0, "addr": f"{addr}:{port}", "kind": got[0], "error": got[1]}
        time.sleep(RETRY_S)


def advertised_address(environ: Mapping[str, str]) -> str:
    """The address the engine would listen on: MCCL_SOCKET_IFNAME's IPv4 address, else the one that routes to
    MASTER_ADDR, else MASTER_ADDR's own host (a single-host fleet)."""
    ifname = environ.get("MCCL_SOCKET_IFNAME")
    if ifname:
        for name, address in host_net.interface_addresses():
            if name == ifname and ":" not in address:
                return address
    return host_net.route_address(environ.get("MASTER_ADDR")) or environ.get("MASTER_ADDR") or "127.0.0.1"


def listen(address: str, port_range: Optional[str], backlog: int) -> socket.socket:
    """A listening socket on `address`, on a port of MCCL_PORT_RANGE (LOW-HIGH) where given, else any."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    low, high = (int(p) for p in port_range.split("-")) if port_range else (0, 0)
    for port in range(low, high + 1):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((address, port))
        except OSError:
            sock.close()
            continue
        sock.listen(backlog)
        return sock
    raise OSError(f"no free port in MCCL_PORT_RANGE={port_range} on {address}")


def reach_all(store, rank: int, world: int, environ: Mapping[str, str] = os.environ,
              timeout: float = REACH_TIMEOUT_S) -> List[dict]:
    """Every failed connection of the fleet (the same list on every rank; module docstring); a collective."""
    address = advertised_address(environ)
    with listen(address, environ.get("MCCL_PORT_RANGE"), world) as sock:
        store.set(f"{KEY}addr/{rank}", json.dumps([address, sock.getsockname()[1]]))
        store.wait([f"{KEY}addr/{r}" for r in range(world)])
        peers = {r: json.loads(store.get(f"{KEY}addr/{r}")) for r in range(world) if r != rank}
        mine = []
        if peers:
            with ThreadPoolExecutor(max_workers=min(32, len(peers))) as pool:
                tried = {r: pool.submit(attempt, a, p, timeout) for r, (a, p) in peers.items()}
            for r, future in sorted(tried.items()):
                got = future.result()
                if got is not None:
                    a, p = peers[r]
                    mine.append({"from": rank, "to": r, "addr": f"{a}:{p}", "kind": got[0], "error": got[1]})
        store.set(f"{KEY}failed/{rank}", json.dumps(mine))
        store.wait([f"{KEY}failed/{r}" for r in range(world)])  # the listener stays until everyone has tried
    return [f for r in range(world) for f in json.loads(store.get(f"{KEY}failed/{r}"))]
