"""A benchmark rank's Gloo control group ends with destroy_process_group(), even when a module that binds the
default group at import comes in after the group exists (timm does, through torch._dynamo, when a rank builds its
model). A group that outlives it keeps Gloo's worker threads into interpreter teardown, where one of them that frees
a finished collective aborts the rank ("terminate called without an active exception"). One rank in a fresh
interpreter: the import state is the point."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lightning_mccl.launcher import free_port

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

RANK = """
import gc, json, os, weakref
import torch
import torch.distributed as dist
from sweep.rank import init_groups

init_groups([], 60.0)
world = weakref.ref(dist.group.WORLD)
import torch.distributed.nn  # noqa: E402,F401  (binds group.WORLD into its functions' defaults)
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
gc.collect()
tasks = "/proc/self/task"
names = [open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)] if os.path.isdir(tasks) else []
print(json.dumps({"group_alive": world() is not None, "gloo_threads": sorted(n for n in names if "gloo" in n)}))
"""


def test_the_control_group_and_its_threads_end_with_destroy_process_group():
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(BENCH), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", RANK], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"group_alive": False, "gloo_threads": []}
