"""What the rank shim and `mccl doctor` ask of a host's network (lightning_mccl.launcher.host_net): its addresses
(getifaddrs through ctypes, against what the kernel routes), and the interface Lightning's Gloo groups get."""
import sys

import pytest

from lightning_mccl.launcher import host_net

ADDRESSES = [("lo0", "127.0.0.1"), ("en0", "10.0.0.12"), ("en1", "192.168.1.30"), ("en0", "fe80::1")]


def test_this_hosts_addresses_include_loopback_and_the_routed_one():
    found = host_net.interface_addresses()
    assert ("lo0" if sys.platform == "darwin" else "lo", "127.0.0.1") in found, found
    assert host_net.route_address("127.0.0.1") == "127.0.0.1"
    assert host_net.route_address("10.0.0.311") is None and host_net.route_address(None) is None
    routed = host_net.route_address("192.0.2.1")  # TEST-NET-1: nothing is sent, the kernel only picks a source
    if routed is not None:
        assert host_net.interface_holding(routed) is not None, (routed, found)


def test_interface_holding_an_address():
    assert host_net.interface_holding("10.0.0.12", ADDRESSES) == "en0"
    assert host_net.interface_holding("fe80::1%en0", ADDRESSES) == "en0"  # a scope id is not part of the address
    assert host_net.interface_holding("10.0.0.99", ADDRESSES) is None
    assert host_net.interface_holding(None, ADDRESSES) is None


@pytest.mark.parametrize("environ, expected", [
    ({"GLOO_SOCKET_IFNAME": "en5", "MCCL_SOCKET_IFNAME": "en0", "MASTER_ADDR": "127.0.0.1"}, "en5"),  # the user's
    ({"MCCL_SOCKET_IFNAME": "mccl0", "MASTER_ADDR": "127.0.0.1"}, "mccl0"),  # the hostfile's ifname (or the switch's)
    ({"MASTER_ADDR": "127.0.0.1"}, "lo0" if sys.platform == "darwin" else "lo"),  # where the route to host 0 leaves
    ({"MASTER_ADDR": "10.0.0.311"}, None),  # no route: Gloo resolves the host name, as without a launcher
    ({}, None),
])
def test_gloo_interface_is_the_one_the_engine_listens_on(environ, expected):
    assert host_net.gloo_interface(environ) == expected
