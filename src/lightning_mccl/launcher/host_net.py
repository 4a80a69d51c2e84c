"""A host's network, as its ranks see it: its interface addresses, the address that routes to MASTER_ADDR,
and the interface a rank's Gloo groups should use. Standard library only (no torch: the rank shim and
`mccl doctor`'s probe import it on every host before anything else runs) and Python 3.10.

Why Gloo needs telling: Lightning makes a Gloo group of its own around `prepare_data` (its
`_InfiniteBarrier`), and a Gloo group without GLOO_SOCKET_IFNAME listens on the address this host's *name*
resolves to. That is loopback where /etc/hosts maps the name to 127.0.x.x (Debian, the switch emulator's
namespaces, a stale entry on a Mac), and may be Wi-Fi on a Mac whose name mDNS resolves there; its peers
then cannot connect ("Gloo connectFullMesh failed ... Connection refused"). `gloo_interface` picks the
interface the mccl engine itself listens on: MCCL_SOCKET_IFNAME (the hostfile's ``ifname``), else the one
holding the address the kernel routes to MASTER_ADDR from (csrc/engine/netif.cc does the same).
"""
import ctypes
import socket
import sys


class _Ifaddrs(ctypes.Structure):
    """The head of getifaddrs(3)'s struct ifaddrs, the same on Linux and macOS."""


_Ifaddrs._fields_ = [("next", ctypes.POINTER(_Ifaddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.c_void_p)]

# Where a sockaddr's family is: a 16-bit sa_family first on Linux; on macOS and the BSDs a length byte comes
# first, then an 8-bit sa_family. The address follows at offset 4 (IPv4) or 8 (IPv6) on all of them.
_BSD_SOCKADDR = sys.platform == "darwin" or "bsd" in sys.platform


def _family(head: bytes) -> int:
    return head[1] if _BSD_SOCKADDR else int.from_bytes(head, sys.byteorder)


def interface_addresses():
    """[(interface, address)] of this host's IPv4 and IPv6 addresses, loopback included (getifaddrs(3)
    through ctypes); [] where that is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        head = ctypes.POINTER(_Ifaddrs)()
        if libc.getifaddrs(ctypes.byref(head)) != 0:
            return []
    except (OSError, AttributeError):
        return []
    found = []
    try:
        node = head
        while node:
            entry = node.contents
            if entry.addr:
                family = _family(ctypes.string_at(entry.addr, 2))
                name = entry.name.decode(errors="replace")
                if family == socket.AF_INET:
                    found.append((name, socket.inet_ntop(family, ctypes.string_at(entry.addr + 4, 4))))
                elif family == socket.AF_INET6:
                    found.append((name, socket.inet_ntop(family, ctypes.string_at(entry.addr + 8, 16))))
            node = entry.next
    finally:
        libc.freeifaddrs(head)
    return found


def route_address(dest):
    """The local address the kernel would send from to reach `dest` (a UDP connect sends nothing); None when
    there is no route (or `dest` does not resolve)."""
    if not dest:
        return None
    try:
        family = socket.AF_INET6 if ":" in dest else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((dest, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def interface_holding(address, addresses=None):
    """The name of the interface that has `address` (of `addresses`, default this host's), or None."""
    if address is None:
        return None
    address = address.split("%")[0]
    for name, have in interface_addresses() if addresses is None else addresses:
        if have == address:
            return name
    return None


def gloo_interface(environ):
    """GLOO_SOCKET_IFNAME for a rank whose environment is `environ`: its own GLOO_SOCKET_IFNAME when set,
    else MCCL_SOCKET_IFNAME, else the interface holding the address that routes to MASTER_ADDR; None when
    none is known (Gloo then resolves the host name, as without a launcher)."""
    return (environ.get("GLOO_SOCKET_IFNAME") or environ.get("MCCL_SOCKET_IFNAME")
            or interface_holding(route_address(environ.get("MASTER_ADDR"))))
