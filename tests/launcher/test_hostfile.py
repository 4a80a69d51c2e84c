"""Hostfile parsing and node-rank discovery (lightning_mccl.hostfile): the formats, and every error case
with the message that names the cause."""
import json
import socket
import time

import pytest

from lightning_mccl import hostfile as hostfile_module
from lightning_mccl.hostfile import (Host, HostfileError, check_addresses, find_node_rank, load_hostfile,
                                     parse_hostfile)

YAML = """\
master_port: 29600
hosts:
  - {name: studio-01, addr: 10.0.0.11, ifname: en0}
  - name: studio-02
    addr: 10.0.0.12
  - studio-03.local
"""


def test_yaml_and_json_give_the_same_fleet(tmp_path):
    y = tmp_path / "fleet.yaml"
    y.write_text(YAML)
    j = tmp_path / "fleet.json"
    j.write_text(json.dumps({"master_port": 29600, "hosts": [
        {"name": "studio-01", "addr": "10.0.0.11", "ifname": "en0"},
        {"name": "studio-02", "addr": "10.0.0.12"}, "studio-03.local"]}))
    a, b = load_hostfile(y), load_hostfile(j)
    assert a.hosts == b.hosts == (Host("studio-01", "10.0.0.11", "en0"), Host("studio-02", "10.0.0.12"),
                                  Host("studio-03.local", "studio-03.local"))
    assert a.master_port == b.master_port == 29600
    assert a.num_nodes == 3 and a.master_addr == "10.0.0.11"
    assert a.lines == (3, 4, 6) and b.lines == (1, 1, 1)  # where each host's entry starts (JSON: one line)
    assert a.where(1) == f"{y}:4: hosts[1] (studio-02)"
    assert parse_hostfile(["x"]).where(0) == "<memory>: hosts[0] (x)"  # no file, no line


def test_bare_list_and_default_port():
    hf = parse_hostfile([{"name": "a", "addr": "10.0.0.1"}])
    assert hf.master_port == 29500 and hf.num_nodes == 1


@pytest.mark.parametrize("data, fragment", [
    ({"nodes": []}, "expected a mapping with a 'hosts' list"),
    ({"hosts": []}, "non-empty list"),
    ({"hosts": [{"name": "a", "addr": "1.1.1.1"}], "port": 1}, "unknown key(s) ['port']"),
    ({"hosts": [{"name": "a", "addr": "1.1.1.1", "user": "x"}]}, "hosts[0] has unknown key(s) ['user']"),
    ({"hosts": [42]}, "hosts[0] must be a mapping"),
    ({"hosts": [{"ifname": "en0"}]}, "hosts[0] needs 'name'"),
    ({"hosts": [{"name": "a", "addr": "1.1.1.1", "ifname": 3}]}, "hosts[0].ifname must be a string"),
    ({"hosts": [{"name": "a", "addr": "1.1.1.1"}, {"name": "b", "addr": "1.1.1.1"}]},
     "hosts[0] and hosts[1] have the same addr '1.1.1.1'"),
    ({"hosts": [{"name": "a", "addr": "1.1.1.1"}, {"name": "a", "addr": "1.1.1.2"}]},
     "hosts[0] and hosts[1] have the same name 'a'"),
    ({"hosts": ["a"], "master_port": 70000}, "master_port must be an integer port"),
    ({"hosts": ["a"], "master_port": True}, "master_port must be an integer port, got True"),
])
def test_bad_hostfiles_name_the_problem(data, fragment):
    with pytest.raises(HostfileError) as info:
        parse_hostfile(data, "fleet.yaml")
    assert fragment in str(info.value) and "fleet.yaml" in str(info.value)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(HostfileError, match="cannot read hostfile .*missing.yaml"):
        load_hostfile(tmp_path / "missing.yaml")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"hosts": [')
    with pytest.raises(HostfileError, match="not valid JSON"):
        load_hostfile(bad_json)
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("hosts: [a, b\n")
    with pytest.raises(HostfileError, match="not valid YAML"):
        load_hostfile(bad_yaml)


FLEET = parse_hostfile({"hosts": [{"name": "s1", "addr": "10.0.0.11"}, {"name": "s2", "addr": "10.0.0.12"},
                                  {"name": "s3", "addr": "10.0.0.13"}]}, "fleet.yaml")


def test_node_rank_from_this_machines_addresses():
    assert find_node_rank(FLEET, env={}, addresses=["127.0.0.1", "10.0.0.12"]) == 1
    assert find_node_rank(FLEET, env={}, addresses=["10.0.0.13"]) == 2


def test_node_rank_from_the_environment_wins():
    assert find_node_rank(FLEET, env={"MCCL_NODE_RANK": "2"}, addresses=["10.0.0.11"]) == 2
    assert find_node_rank(FLEET, env={"NODE_RANK": "0"}, addresses=[]) == 0
    assert find_node_rank(FLEET, env={"GROUP_RANK": "1"}, addresses=["10.0.0.11"]) == 1  # torchrun's name
    assert find_node_rank(FLEET, env={"MCCL_NODE_RANK": "2", "NODE_RANK": "1", "GROUP_RANK": "0"}, addresses=[]) == 2
    assert find_node_rank(FLEET, env={"NODE_RANK": "", "GROUP_RANK": "2"}, addresses=[]) == 2  # empty: unset


def test_node_rank_errors():
    with pytest.raises(HostfileError, match=r"is none of the hosts in fleet.yaml .*s1=10.0.0.11.*MCCL_NODE_RANK"):
        find_node_rank(FLEET, env={}, addresses=["192.0.2.7"])
    with pytest.raises(HostfileError, match="matches several hosts in fleet.yaml"):
        find_node_rank(FLEET, env={}, addresses=["10.0.0.11", "10.0.0.12"])
    with pytest.raises(HostfileError, match=r"MCCL_NODE_RANK=3 is outside the 3 hosts"):
        find_node_rank(FLEET, env={"MCCL_NODE_RANK": "3"}, addresses=[])
    with pytest.raises(HostfileError, match=r"NODE_RANK='x' is not an integer"):
        find_node_rank(FLEET, env={"NODE_RANK": "x"}, addresses=[])
    with pytest.raises(HostfileError, match=r"^GROUP_RANK=5 is outside the 3 hosts of fleet.yaml$"):
        find_node_rank(FLEET, env={"GROUP_RANK": "5"}, addresses=["10.0.0.11"])


def test_local_addresses_include_loopback():
    from lightning_mccl.hostfile import local_addresses

    assert "127.0.0.1" in local_addresses()


BAD_ADDRESSES = """\
hosts:
  - {name: mac-0, addr: 10.0.0.11}
  - {name: mac-1, addr: 10.0.0.311}
  - name: mac-2
    addr: 10.0.0.13/24
  - {name: mac-3, addr: nosuch.example}
  - {name: mac-4, addr: slow.example}
  - {name: mac-5, addr: fine.example}
  - {name: mac-6, addr: 0.0.0.0}
"""


def test_check_addresses_names_every_bad_entry_with_its_line(tmp_path, monkeypatch):
    def getaddrinfo(name, *args, **kwargs):
        if name == "slow.example":
            time.sleep(5)
        if name == "nosuch.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.16", 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    path = tmp_path / "fleet.yaml"
    path.write_text(BAD_ADDRESSES)
    start = time.monotonic()
    with pytest.raises(HostfileError) as info:
        check_addresses(load_hostfile(path), timeout=0.5)
    assert time.monotonic() - start < 2.0  # the slow name is given up on at the timeout
    assert str(info.value).splitlines() == [
        f"{path}:3: hosts[1] (mac-1): addr '10.0.0.311' is not an IPv4 address (Octet 311 (> 255) not permitted "
        "in '10.0.0.311')",
        f"{path}:4: hosts[2] (mac-2): addr '10.0.0.13/24' is neither an IP address nor a host name",
        f"{path}:6: hosts[3] (mac-3): addr 'nosuch.example' does not resolve here (Name or service not known)",
        f"{path}:7: hosts[4] (mac-4): addr 'slow.example' does not resolve here within 0.5 s",
        f"{path}:9: hosts[6] (mac-6): addr '0.0.0.0' is the unspecified address, which no peer can connect to",
        "each host's addr must be the IP address (or a name that resolves to it) its peers reach it at, e.g. 10.0.0.12",
    ]
    good = parse_hostfile([{"name": "a", "addr": "10.0.0.1"}, {"name": "b", "addr": "fe80::1%en0"}, "fine.example"])
    check_addresses(good)  # IP addresses are never looked up; a name that resolves is fine


@pytest.mark.parametrize("addr, ok", [("studio-01", True), ("studio-01.local", True), ("10.0.0.1", True),
                                      ("1.2.3", False), ("studio 01", False), ("-x", False), ("a..b", False),
                                      ("224.0.0.1", False)])
def test_address_syntax(addr, ok):
    assert (hostfile_module.address_problem(addr) is None) == ok
