"""Helpers for the Lightning tests' child processes: an environment without the launcher variables a
developer's shell may carry (a free port: lightning_mccl.launcher.free_port). (Named apart from tests/torch's
modules: both directories are on sys.path when the whole suite runs.)"""
from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))

# Variables that would make Lightning, torch or MacFleetEnvironment think a launcher placed this process.
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK", "RANK", "WORLD_SIZE",
               "LOCAL_WORLD_SIZE", "MCCL_NODE_RANK", "MCCL_HOSTFILE", "MCCL_SOCKET_IFNAME", "TORCHELASTIC_RUN_ID", "MCCL_HOSTS",
               "PL_GLOBAL_SEED", "STANDALONE_PORT")


def clean_env(extra: dict | None = None) -> dict:
    """os.environ without LAUNCH_VARS, one thread per rank, plus `extra`: for child processes."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env
