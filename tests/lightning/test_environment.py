"""MacFleetEnvironment: node rank from the hostfile (this machine's real addresses, MCCL_NODE_RANK), the
variables torchrun and Lightning's launcher set, MCCL_SOCKET_IFNAME, and its use by MCCLStrategy.

Hostfile parsing errors are hostfile.py's (tests/torch); here only what the environment adds. The hostfiles
put this machine at 127.0.0.1 (getifaddrs always lists loopback) and the other hosts at TEST-NET-3
addresses that no machine has; nothing is ever contacted.
"""
from __future__ import annotations

import os
import socket

import pytest

from lightning_mccl.hostfile import HostfileError, local_addresses

ELSEWHERE = ["203.0.113.77", "203.0.113.78"]


@pytest.fixture(scope="module", autouse=True)
def elsewhere_is_not_here():
    mine = local_addresses()
    assert "127.0.0.1" in mine and not mine & set(ELSEWHERE), f"this machine's addresses {mine}"


def write_hostfile(tmp_path, hosts, master_port=29123, name="fleet.yaml"):
    lines = [f"master_port: {master_port}", "hosts:"]
    for host in hosts:
        lines.append("  - " + "{" + ", ".join(f"{k}: {v}" for k, v in host.items()) + "}")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def fleet(tmp_path):
    """studio-01 elsewhere, studio-02 = this machine (with an ifname), studio-03 elsewhere."""
    return write_hostfile(tmp_path, [
        {"name": "studio-01", "addr": ELSEWHERE[0]},
        {"name": "studio-02", "addr": "127.0.0.1", "ifname": "lo"},
        {"name": "studio-03", "addr": ELSEWHERE[1], "ifname": "en7"},
    ])


def test_hostfile_places_this_machine_by_its_addresses(no_launch_env, fleet):
    from lightning_mccl.lightning import MacFleetEnvironment

    env = MacFleetEnvironment(fleet)
    assert env.node_rank() == 1
    assert (env.main_address, env.main_port) == (ELSEWHERE[0], 29123)
    assert env.ifname == "lo" and "MCCL_SOCKET_IFNAME" not in os.environ  # the group's setting, not the environment
    assert (env.local_rank(), env.world_size(), env.global_rank()) == (0, 1, 0)
    assert env.creates_processes_externally is False
    assert env.hostfile.num_nodes == 3


def test_the_hosts_ifname_goes_to_the_group_unless_the_environment_or_options_name_one(no_launch_env, fleet):
    from lightning_mccl.lightning import MacFleetEnvironment
    from lightning_mccl.lightning.group import fleet_settings

    env = MacFleetEnvironment(fleet)
    assert fleet_settings(env, {}) == {"MCCL_SOCKET_IFNAME": "lo"}
    assert fleet_settings(env, {"MCCL_SOCKET_IFNAME": "en1"}) == {}  # the strategy's options win
    no_launch_env.setenv("MCCL_SOCKET_IFNAME", "en0")
    assert fleet_settings(env, {}) == {}  # so does the environment (the group reads it)
    assert os.environ["MCCL_SOCKET_IFNAME"] == "en0"


@pytest.mark.parametrize("var", ["MCCL_NODE_RANK", "NODE_RANK", "GROUP_RANK"])
def test_node_rank_variable_wins_over_addresses(no_launch_env, fleet, var):
    from lightning_mccl.lightning import MacFleetEnvironment

    no_launch_env.setenv(var, "2")
    env = MacFleetEnvironment(str(fleet))
    assert env.node_rank() == 2
    assert env.ifname == "en7"  # that host's ifname


def test_machine_in_no_host_is_an_error_naming_host_and_file(no_launch_env, tmp_path):
    from lightning_mccl.lightning import MacFleetEnvironment

    path = write_hostfile(tmp_path, [{"name": "studio-01", "addr": ELSEWHERE[0]},
                                     {"name": "studio-03", "addr": ELSEWHERE[1]}], name="other.yaml")
    with pytest.raises(HostfileError) as info:
        MacFleetEnvironment(path)
    message = str(info.value)
    assert socket.gethostname() in message and str(path) in message and "MCCL_NODE_RANK" in message
    assert f"studio-01={ELSEWHERE[0]}" in message
    assert "MCCL_SOCKET_IFNAME" not in os.environ


def test_missing_hostfile_is_a_hostfile_error(no_launch_env, tmp_path):
    from lightning_mccl.lightning import MacFleetEnvironment

    with pytest.raises(HostfileError, match="cannot read hostfile .*absent.yaml"):
        MacFleetEnvironment(tmp_path / "absent.yaml")


def test_hostfile_from_mccl_hostfile_and_detect(no_launch_env, fleet):
    from lightning_mccl.lightning import MacFleetEnvironment

    assert MacFleetEnvironment.detect() is False
    assert MacFleetEnvironment().hostfile is None
    no_launch_env.setenv("MCCL_HOSTFILE", str(fleet))
    assert MacFleetEnvironment.detect() is True
    env = MacFleetEnvironment()
    assert env.hostfile.path == str(fleet) and env.node_rank() == 1


def test_launcher_variables_win_over_the_hostfile(no_launch_env, fleet):
    from lightning_mccl.lightning import MacFleetEnvironment

    no_launch_env.setenv("MASTER_ADDR", "198.51.100.1")
    no_launch_env.setenv("MASTER_PORT", "4567")
    env = MacFleetEnvironment(fleet)
    assert (env.main_address, env.main_port) == ("198.51.100.1", 4567)


def test_torchrun_variables_without_a_hostfile(no_launch_env):
    from lightning_mccl.lightning import MacFleetEnvironment

    for name, value in dict(MASTER_ADDR="198.51.100.1", MASTER_PORT="4567", GROUP_RANK="3", WORLD_SIZE="8",
                            RANK="7", LOCAL_RANK="1").items():
        no_launch_env.setenv(name, value)
    env = MacFleetEnvironment()
    assert (env.main_address, env.main_port) == ("198.51.100.1", 4567)
    assert (env.node_rank(), env.world_size(), env.global_rank(), env.local_rank()) == (3, 8, 7, 1)
    assert env.creates_processes_externally is True
    no_launch_env.setenv("NODE_RANK", "2")
    assert env.node_rank() == 2
    no_launch_env.setenv("MCCL_NODE_RANK", "1")
    assert env.node_rank() == 1
    env.validate_settings(num_devices=2, num_nodes=4)
    with pytest.raises(ValueError, match=r"devices=2.*num_nodes=3.*WORLD_SIZE=8"):
        env.validate_settings(num_devices=2, num_nodes=3)
    no_launch_env.setenv("NODE_RANK", "two")
    no_launch_env.delenv("MCCL_NODE_RANK")
    with pytest.raises(ValueError, match="NODE_RANK='two' is not an integer"):
        env.node_rank()


def test_plain_environment_defaults(no_launch_env):
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    from lightning_mccl.lightning import MacFleetEnvironment

    no_launch_env.setattr(rank_zero_only, "rank", 0)
    env = MacFleetEnvironment()
    assert env.main_address == "127.0.0.1" and env.main_port == env.main_port > 0  # a free port, chosen once
    assert (env.node_rank(), env.world_size(), env.global_rank(), env.local_rank()) == (0, 1, 0, 0)
    env.set_world_size(6)
    env.set_global_rank(5)
    assert (env.world_size(), env.global_rank(), rank_zero_only.rank) == (6, 5, 5)


def test_num_nodes_must_match_the_hostfile(no_launch_env, fleet):
    from lightning_mccl.lightning import MacFleetEnvironment

    env = MacFleetEnvironment(fleet)
    env.validate_settings(num_devices=1, num_nodes=3)
    with pytest.raises(ValueError, match=rf"num_nodes=2\) but the hostfile {fleet} lists 3 hosts"):
        env.validate_settings(num_devices=1, num_nodes=2)


def test_mccl_strategy_uses_the_fleet_named_by_mccl_hostfile(no_launch_env, fleet, tmp_path):
    import lightning as L
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    from lightning_mccl.lightning import MacFleetEnvironment

    no_launch_env.setenv("MCCL_HOSTFILE", str(fleet))
    no_launch_env.setattr(rank_zero_only, "rank", 0)
    kwargs = dict(accelerator="cpu", devices=1, num_nodes=3, logger=False, enable_checkpointing=False,
                  default_root_dir=str(tmp_path))
    trainer = L.Trainer(strategy="mccl", **kwargs)
    assert type(trainer.strategy.cluster_environment) is MacFleetEnvironment
    assert (trainer.node_rank, trainer.global_rank, trainer.world_size) == (1, 1, 3)
    assert trainer.strategy.cluster_environment.main_address == ELSEWHERE[0]
    # an environment the user chose (or one Lightning detected: torchrun's, SLURM's) is kept

    class MyEnvironment(LightningEnvironment):
        pass

    trainer = L.Trainer(strategy="mccl", plugins=[MyEnvironment()], **kwargs)
    assert type(trainer.strategy.cluster_environment) is MyEnvironment
    trainer = L.Trainer(strategy="ddp", **kwargs)
    assert type(trainer.strategy.cluster_environment) is not MacFleetEnvironment


def test_mccl_fabric_strategy_uses_the_fleet_named_by_mccl_hostfile(no_launch_env, fleet):
    import lightning as L
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from lightning_mccl.lightning import MacFleetEnvironment

    no_launch_env.setenv("MCCL_HOSTFILE", str(fleet))
    no_launch_env.setattr(rank_zero_only, "rank", 0)
    fabric = L.Fabric(strategy="mccl", accelerator="cpu", devices=1, num_nodes=3)
    assert type(fabric.strategy.cluster_environment) is MacFleetEnvironment
    assert (fabric.node_rank, fabric.global_rank, fabric.world_size) == (1, 1, 3)

    class MyEnvironment(LightningEnvironment):
        pass

    fabric = L.Fabric(strategy="mccl", accelerator="cpu", devices=1, num_nodes=3, plugins=[MyEnvironment()])
    assert type(fabric.strategy.cluster_environment) is MyEnvironment
