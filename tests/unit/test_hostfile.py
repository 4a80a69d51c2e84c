"""Hostfile parsing and node-rank discovery (lightning_mccl.hostfile): the formats, and every error case
with the message that names the cause."""
import json

import pytest

from lightning_mccl.hostfile import Host, HostfileError, find_node_rank, load_hostfile, parse_hostfile

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
