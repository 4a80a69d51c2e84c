"""`MacFleetEnvironment`: where this process sits in a fleet of Macs, from a hostfile or the environment.

    # the same command on every Mac:
    trainer = Trainer(strategy="mccl", num_nodes=2, plugins=[MacFleetEnvironment("fleet.yaml")])
    # or, with no plugin at all: MCCL_HOSTFILE=fleet.yaml python train.py   (see MacFleetEnvironment.detect)

With a hostfile (`lightning_mccl.hostfile`), each Mac finds its node rank by matching its own addresses
against the hosts' `addr` (or from MCCL_NODE_RANK / NODE_RANK / GROUP_RANK: `hostfile.NODE_RANK_VARS`), the
main address is host 0's `addr` and the port is the file's `master_port`. The host's `ifname`, when given, is
`ifname`: the strategies' group listens there (MCCL_SOCKET_IFNAME in its pg_options, unless the environment
names one). Without a hostfile the values come from the variables torchrun and Lightning's launcher set.

Environment variables win over the hostfile where both say something (MASTER_ADDR, MASTER_PORT, the node
rank): a launcher that set them (torchrun, Lightning's own for its child processes) is authoritative.

`creates_processes_externally` is True when LOCAL_RANK is set, as for Lightning's default environment: a
launcher (`torchrun`, or a fleet launcher that starts each process) already started every process, so
Lightning starts none. Without LOCAL_RANK, Lightning starts `devices - 1` more processes on each Mac (none with
`accelerator="mps"`, which has one device).
"""
from __future__ import annotations

import os
from typing import Optional, Union

from typing_extensions import override

from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.fabric.plugins.environments.lightning import find_free_network_port
from lightning.fabric.utilities.rank_zero import rank_zero_only

from ..hostfile import NODE_RANK_VARS, Hostfile, HostfileError, find_node_rank, load_hostfile

HOSTFILE_VAR = "MCCL_HOSTFILE"
IFNAME_VAR = "MCCL_SOCKET_IFNAME"


def _int_env(name: str) -> Optional[int]:
    value = os.environ.get(name, "")
    if value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


class MacFleetEnvironment(ClusterEnvironment):
    """A fleet of Macs (one or more processes each) described by a hostfile, or by environment variables.

    Args:
        hostfile: path of a YAML/JSON hostfile, or a parsed `Hostfile`; default: $MCCL_HOSTFILE, and when that
            is unset too, environment variables only (MASTER_ADDR, MASTER_PORT, MCCL_NODE_RANK/NODE_RANK/
            GROUP_RANK, WORLD_SIZE, RANK, LOCAL_RANK).

    Raises:
        HostfileError: the hostfile cannot be read or parsed, or this machine is none (or several) of its hosts.
    """

    def __init__(self, hostfile: Optional[Union[str, os.PathLike, Hostfile]] = None) -> None:
        super().__init__()
        if hostfile is None:
            hostfile = os.environ.get(HOSTFILE_VAR) or None
        if hostfile is not None and not isinstance(hostfile, Hostfile):
            hostfile = load_hostfile(hostfile)
        self.hostfile: Optional[Hostfile] = hostfile
        self._host_node_rank: Optional[int] = None
        self.ifname: Optional[str] = None  # the interface this host's ranks listen on, from the hostfile
        if hostfile is not None:
            self._host_node_rank = find_node_rank(hostfile)
            self.ifname = hostfile.hosts[self._host_node_rank].ifname or None
        self._main_port: Optional[int] = None
        self._world_size: int = _int_env("WORLD_SIZE") or 1
        self._global_rank: int = _int_env("RANK") or 0

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in os.environ

    @property
    @override
    def main_address(self) -> str:
        if os.environ.get("MASTER_ADDR"):
            return os.environ["MASTER_ADDR"]
        if self.hostfile is not None:
            return self.hostfile.master_addr
        return "127.0.0.1"

    @property
    @override
    def main_port(self) -> int:
        if self._main_port is None:
            port = _int_env("MASTER_PORT")
            if port is None:
                port = self.hostfile.master_port if self.hostfile is not None else find_free_network_port()
            self._main_port = port
        return self._main_port

    @staticmethod
    @override
    def detect() -> bool:
        """True when $MCCL_HOSTFILE names the fleet (MCCLStrategy then uses this environment by itself)."""
        return bool(os.environ.get(HOSTFILE_VAR))

    @override
    def world_size(self) -> int:
        return self._world_size

    @override
    def set_world_size(self, size: int) -> None:
        self._world_size = size

    @override
    def global_rank(self) -> int:
        return self._global_rank

    @override
    def set_global_rank(self, rank: int) -> None:
        self._global_rank = rank
        rank_zero_only.rank = rank

    @override
    def local_rank(self) -> int:
        return _int_env("LOCAL_RANK") or 0

    @override
    def node_rank(self) -> int:
        if self._host_node_rank is not None:
            return self._host_node_rank
        for name in NODE_RANK_VARS:
            value = _int_env(name)
            if value is not None:
                return value
        return 0

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if self.hostfile is not None and num_nodes != self.hostfile.num_nodes:
            raise ValueError(
                f"Trainer(num_nodes={num_nodes}) but the hostfile {self.hostfile.path} lists"
                f" {self.hostfile.num_nodes} hosts; set num_nodes={self.hostfile.num_nodes} or edit the hostfile"
            )
        world_size = _int_env("WORLD_SIZE")
        if self.creates_processes_externally and world_size is not None and num_devices * num_nodes != world_size:
            raise ValueError(
                f"You set `devices={num_devices}` and `num_nodes={num_nodes}` in Lightning, but the product"
                f" ({num_devices} * {num_nodes}) does not match the launcher's WORLD_SIZE={world_size}."
            )


__all__ = ["MacFleetEnvironment", "HostfileError"]
