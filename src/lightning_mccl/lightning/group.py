"""The default process group of the mccl strategies, one setup for the Trainer's (`MCCLStrategy`) and
Fabric's (`MCCLFabricStrategy`): the timeout, the fleet's cluster environment, DDP's bucket size, the
rendezvous and the exit hook.

`init_default_group` is what both strategies' setup calls instead of Lightning's `_init_dist_connection`
alone:

- no `device_id`: Lightning binds the default group to the root device when it is not a CPU, and every later
  group inherits the binding (torch `_new_group_with_tag`), so the Gloo group of Lightning's own
  `_InfiniteBarrier` would be bound to MPS, where Gloo cannot run. mccl needs no binding.
- a new group rendezvouses through `lightning_mccl.rendezvous` (torch's TCPStore, waiting in Python): ranks that
  have not arrived are named every few seconds, and after the group timeout in the error; its settings (the
  strategy's `options`, the wire type) go in its `pg_options`, never in the environment.
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
from typing import Callable, Dict, Optional, Union

import torch
import torch.distributed

from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

from .. import _backend  # importing the lightning_mccl package registered the "mccl" backend
from ..options import Options
from .environment import MacFleetEnvironment
from .internals import checked

_init_dist_connection = checked("lightning.fabric.utilities.distributed", "_init_dist_connection",
                                ("cluster_environment", "torch_distributed_backend"))

BACKEND = _backend.BACKEND_NAME
DEFAULT_TIMEOUT = default_pg_timeout  # torch's 30 minutes, as Lightning's DDP
# DDP's bucket size over mccl when bucket_cap_mb is not given: 5 MB (docs/performance.md, "DDP settings for
# fleets"); other backends keep DDP's 25.
BUCKET_CAP_MB = 5.0
# The same for compress="powersgd": one bucket, so that the hook's chain of collectives and matrix work runs
# once a step (docs/performance.md, "DDP settings for fleets", PowerSGD wants one bucket).
POWERSGD_BUCKET_CAP_MB = 1000.0
# The same for compress="int8": 25 MB, since each bucket pays the codec's fixed cost (about 37 device kernels
# to queue) and the exchange's per-collective cost (docs/int8.md, "Speed on the fleet stand-in": 25 MB buckets
# 7-8% faster than 5 MB at 8 hosts, in two runs).
INT8_BUCKET_CAP_MB = 25.0


def group_timeout(timeout: Optional[Union[timedelta, float]], owner: str) -> Optional[timedelta]:
    """A strategy's `timeout` argument as the process group's timedelta (None stays None); ValueError naming
    `owner` for anything but a timedelta or a positive number of seconds."""
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"{owner}(timeout={timeout!r}): expected a timedelta or a positive number of seconds")
    return timedelta(seconds=timeout)


def bucket_cap_mb(given: Optional[float], backend: Optional[str], compress: Optional[str] = None) -> Optional[float]:
    """DDP's bucket_cap_mb for a strategy: `given`, else the fleet default over mccl, else None (DDP's own)."""
    if given is not None or backend != BACKEND:
        return given
    return {"powersgd": POWERSGD_BUCKET_CAP_MB, "int8": INT8_BUCKET_CAP_MB}.get(compress, BUCKET_CAP_MB)


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
                       settings: Callable[[Optional[str]], Dict[str, str]] = lambda existing: {}) -> bool:
    """Makes (or reuses) the default mccl group as the module docstring says; True when it made one.

    `settings(existing)` gives the new group's pg_options settings; `existing` is the wire type the engine of
    the default group that already exists read (None when there is none), so that the caller can refuse a
    reuse that would train otherwise than asked (compress.wire_settings)."""
    created = not torch.distributed.is_initialized()
    if not created:
        backend = torch.distributed.get_backend()
        if backend != BACKEND:
            raise ValueError(f"{owner}: the default process group that already exists runs {backend!r}, not mccl: "
                             f"destroy it first (torch.distributed.destroy_process_group()) or use "
                             f"process_group_backend={backend!r}")
    wanted = settings(None if created else _backend.wire_dtype_of())
    kwargs = {}
    if created:
        kwargs = {"store": rendezvous_store(env, timeout), "pg_options": Options(wanted) if wanted else None}
    _init_dist_connection(env, BACKEND, timeout=timeout, **kwargs)
    if created:
        destroy_at_exit()
    return created


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
