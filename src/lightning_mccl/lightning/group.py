"""The default process group of the mccl strategies, one setup for the Trainer's (`MCCLStrategy`) and
Fabric's (`MCCLFabricStrategy`) and DiLoCo's (`MCCLDiLoCoStrategy`): the timeout, the fleet's cluster
environment, the group's settings, the rendezvous and the exit hook.

`init_default_group` is what both strategies' setup calls instead of Lightning's `_init_dist_connection`
alone:

- no `device_id`: Lightning binds the default group to the root device when it is not a CPU, and every later
  group inherits the binding (torch `_new_group_with_tag`), so the Gloo group of Lightning's own
  `_InfiniteBarrier` would be bound to MPS, where Gloo cannot run. mccl needs no binding.
- a new group rendezvouses through `lightning_mccl.rendezvous` (torch's TCPStore, waiting in Python): ranks that
  have not arrived are named every few seconds, and after the group timeout in the error; its settings (the
  strategy's `options`, the wire type, the hostfile's interface) go in its `pg_options`, never in the
  environment.
- a default group that exists already is reused, as Lightning's DDP reuses its own, but only an mccl one:
  Lightning would otherwise train silently over whatever backend it runs (ValueError naming it).
- the group this made is destroyed at interpreter exit (`destroy_at_exit`), before interpreter shutdown tears
  down what the engine's threads use. Lightning does that for NCCL only. Not in `teardown`: a second fit in
  the same script would then re-initialise on the same MASTER_PORT while rank 0's old TCPStore may still be up,
  and a rank can reach that old store ("Connection reset by peer" in TCPStore.waitForWorkers, seen once in
  about 80 re-initialisations here).
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
from datetime import timedelta
from typing import Dict, Mapping, Optional, Union

import torch
import torch.distributed

from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

from .. import wire_policy
from ..backend import wire_dtype_of, wire_type
from ..options import Options
from ..wire_policy import WIRE_ENV
from .environment import IFNAME_VAR, MacFleetEnvironment
from .internals import INIT_DIST, checked

BACKEND = wire_policy.MCCL
DEFAULT_TIMEOUT = default_pg_timeout  # torch's 30 minutes, as Lightning's DDP


def group_timeout(timeout: Optional[Union[timedelta, float]], owner: str) -> Optional[timedelta]:
    """A strategy's `timeout` argument as the process group's timedelta (None stays None); ValueError naming
    `owner` for anything but a timedelta or a positive number of seconds."""
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"{owner}(timeout={timeout!r}): expected a timedelta or a positive number of seconds")
    return timedelta(seconds=timeout)


def check_devices_per_node(devices: int, num_nodes: int) -> None:
    """ValueError when the launcher (`mccl launch`, torchrun: LOCAL_WORLD_SIZE) started another number of processes
    on this node than `devices`: Lightning compares only devices x num_nodes with the world size, and a rank would
    then index a device list that is too short (or two ranks would each believe they are their node's first)."""
    local, world = os.environ.get("LOCAL_WORLD_SIZE", ""), os.environ.get("WORLD_SIZE", "")
    if not local.isdigit() or "LOCAL_RANK" not in os.environ or int(local) == devices:
        return
    if world.isdigit() and devices * num_nodes != int(world):
        return  # Lightning's own check names the product next
    raise ValueError(f"You set `devices={devices}` and `num_nodes={num_nodes}` in Lightning, but the launcher started "
                     f"{local} processes on this node (LOCAL_WORLD_SIZE={local}): set devices={local} (`mccl launch "
                     f"--local N` runs N ranks on one node: devices=N, num_nodes=1; `--local N --nproc-per-node P`: "
                     f"num_nodes=N, devices=P)")


def fleet_environment(env: Optional[ClusterEnvironment]) -> Optional[ClusterEnvironment]:
    """The strategies' cluster environment: a `MacFleetEnvironment` when $MCCL_HOSTFILE names the fleet and
    `env` is only Lightning's fallback `LightningEnvironment`, else `env` (one the user chose or that Lightning
    detected, such as torchrun's or SLURM's)."""
    if type(env) is not LightningEnvironment:
        return env
    return MacFleetEnvironment() if MacFleetEnvironment.detect() else env


def init_default_group(owner: str, env: ClusterEnvironment, timeout: Optional[timedelta],
                       options: Mapping[str, str], wire: Optional[str]) -> bool:
    """Makes (or reuses) the default mccl group as the module docstring says; True when it made one.

    A new group is made with `options` (MCCL_* settings), the wire type `wire` (the wire policy's resolution:
    None leaves it to the environment) and the fleet's interface; a group that exists already is reused only
    when its engine read the wire type this fit asks for (`wire_settings`)."""
    connect = checked(*INIT_DIST)
    created = not torch.distributed.is_initialized()
    if not created:
        backend = torch.distributed.get_backend()
        if backend != BACKEND:
            raise ValueError(f"{owner}: the default process group that already exists runs {backend!r}, not mccl: "
                             f"destroy it first (torch.distributed.destroy_process_group()) or use "
                             f"process_group_backend={backend!r}")
        wire_settings(owner, wire, wire_dtype_of())
        connect(env, BACKEND, timeout=timeout)
        return False
    settings = {**fleet_settings(env, options), **options, **wire_settings(owner, wire, None)}
    connect(env, BACKEND, timeout=timeout, store=rendezvous_store(env, timeout),
            pg_options=Options(settings) if settings else None)
    destroy_at_exit()
    return True


def fleet_settings(env: ClusterEnvironment, options: Mapping[str, str]) -> Dict[str, str]:
    """The settings a group takes from the fleet's hostfile: its host's interface (`ifname`), as MCCL_SOCKET_IFNAME,
    unless the environment or the strategy's options name one."""
    ifname = env.ifname if isinstance(env, MacFleetEnvironment) else None
    if not ifname or os.environ.get(IFNAME_VAR) or IFNAME_VAR in options:
        return {}
    return {IFNAME_VAR: ifname}


def wire_settings(owner: str, wire: Optional[str], existing: Optional[str]) -> Dict[str, str]:
    """The pg_options settings that give a new mccl group the wire type `wire`: {MCCL_WIRE_DTYPE: wire}, or {} when
    `wire` is None (the environment decides, as without the strategy). `existing` is the MCCL_WIRE_DTYPE that the
    engine of the default group which already exists, and which Lightning will reuse, read (None: there is none).
    ValueError when the environment, or that group, says otherwise; with `wire` None, when that group's setting is
    not the environment's (a fit after a compressed one would otherwise train compressed without asking). Every
    rank runs the same code, so every rank passes the same value; the engine checks that on the wire too. Never
    writes the environment."""
    env = os.environ.get(WIRE_ENV)
    if wire is None:
        have = None if existing is None else wire_type(existing)
        if have is not None and have != wire_type(env if env is not None else "off"):
            if have == "off":
                hint = f"remove {WIRE_ENV} from the environment"
            elif env is None:
                hint = f"pass compress={have!r}"
            else:
                hint = f"set {WIRE_ENV}={have}"
            raise ValueError(f"{owner}(compress=None): the existing default process group, which this fit reuses, "
                             f"was made with {WIRE_ENV}={existing}, but the environment says "
                             f"{WIRE_ENV}={env if env is not None else 'off (unset)'} (a group keeps what it read "
                             f"when it was made); call torch.distributed.destroy_process_group() before this fit, "
                             f"or {hint} to train as that group does")
        return {}
    want = wire_type(wire)
    if env is not None and wire_type(env) != want:
        raise ValueError(f"{owner}(compress={wire!r}) but {WIRE_ENV}={env} in the environment: remove the variable "
                         f"or make them agree")
    if existing is not None and wire_type(existing) != want:
        raise ValueError(f"{owner}(compress={wire!r}): the existing default process group, which this fit reuses, "
                         f"was made with {WIRE_ENV}={existing} (a group keeps what it read when it was made); call "
                         f"torch.distributed.destroy_process_group() before this fit, or use the same compress")
    return {WIRE_ENV: wire}


def rendezvous_store(env: ClusterEnvironment, timeout: Optional[timedelta]) -> torch.distributed.Store:
    """The store a new group is made with (`lightning_mccl.rendezvous`): it names the ranks (and hosts) that
    have not arrived while the others wait, fails naming them after the group timeout, and honours Ctrl-C."""
    from ..rendezvous import rendezvous

    return rendezvous(env.main_address, env.main_port, env.global_rank(), env.world_size(),
                      timeout or default_pg_timeout)


def destroy_at_exit() -> None:
    """Has the default group destroyed at interpreter exit; once, however often it is called (atexit keeps
    one registration of `_destroy_default_group`)."""
    atexit.unregister(_destroy_default_group)
    atexit.register(_destroy_default_group)


def _destroy_default_group() -> None:
    """The exit handler: destroys the default group, if any, with Ctrl+C ignored meanwhile."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        torch.distributed.destroy_process_group()
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
