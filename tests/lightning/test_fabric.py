"""Fabric over mccl: real loops on 2 CPU ranks (fabric_script.py) give Fabric's DDP-over-Gloo weights through
`Fabric(strategy="mccl", devices=2)` and `Fabric(strategy="mccl", num_nodes=2)` under `mccl launch --local 2
--nproc-per-node 1` (2 nodes of 1 rank) (fabric_script.py also has an `MCCLFabricStrategy` instance with accelerator="auto": `instance`); and on the MPS stand-in (conftest.py) Fabric refuses its
own DDP while "mccl" passes as a name and as an instance, and sets up its group without device_id and its
module without a CUDA stream."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from launch_env import HERE, clean_env
from lightning_mccl.launcher import free_port
from spies import forbid_cuda_stream, spy_init_process_group

SCRIPT = os.path.join(HERE, "fabric_script.py")
DEADLINE_S = 240
RUNS = {
    "ddp": lambda out: [sys.executable, SCRIPT, out, "ddp"],
    "mccl": lambda out: [sys.executable, SCRIPT, out, "mccl"],
    "nodes": lambda out: [sys.executable, "-m", "lightning_mccl.cli", "launch", "--local", "2",
                          "--nproc-per-node", "1", "--", sys.executable, SCRIPT, out, "nodes"],
}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fabric"))
    procs = {name: subprocess.Popen(cmd(out), cwd=out, env=clean_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for name, cmd in RUNS.items()}
    deadline = time.monotonic() + DEADLINE_S
    failures = []
    for name, proc in procs.items():
        try:
            output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            output, _ = proc.communicate()
            failures.append(f"--- {name}: still running after {DEADLINE_S} s (killed)\n{output[-4000:]}")
            continue
        if proc.returncode != 0:
            failures.append(f"--- {name}: exit {proc.returncode}\n{output[-4000:]}")
    if failures:
        pytest.fail("Fabric runs failed:\n" + "\n".join(failures), pytrace=False)
    return {(name, rank): torch.load(os.path.join(out, f"{name}.rank{rank}.pt")) for name in RUNS for rank in (0, 1)}


@pytest.mark.slow
@pytest.mark.parametrize("run", ["mccl", "nodes"])
def test_fabric_over_mccl_equals_fabric_ddp_over_gloo(records, run):
    ref = records[("ddp", 0)]
    assert (ref["backend"], ref["strategy"], ref["world_size"]) == ("gloo", "DDPStrategy", 2)
    for rank in (0, 1):
        rec = records[(run, rank)]
        assert (rec["backend"], rec["strategy"], rec["world_size"]) == ("mccl", "MCCLFabricStrategy", 2)
        assert rec["allreduces"] >= 6, "the gradients did not go through the mccl engine"
        for key, value in ref["params"].items():
            torch.testing.assert_close(rec["params"][key], value, atol=1e-6, rtol=1e-6)


# -- in this process, on the MPS stand-in --------------------------------------------------------------------


def test_fabric_refuses_its_ddp_on_the_mps_stand_in(mps_stand_in):
    import lightning as L

    with pytest.raises(ValueError, match="not supported on the MPS accelerator"):
        L.Fabric(strategy="ddp", accelerator="mps", devices=1)


@pytest.mark.parametrize("accelerator", ["mps", "auto"])
@pytest.mark.parametrize("as_instance", [False, True])
def test_mccl_passes_fabrics_connector_on_mps(mps_stand_in, accelerator, as_instance):
    import lightning as L
    from lightning.fabric import connector
    from lightning.fabric.accelerators import MPSAccelerator

    from lightning_mccl.lightning import MCCLFabricStrategy

    fabric = L.Fabric(strategy=MCCLFabricStrategy() if as_instance else "mccl", accelerator=accelerator, devices=1,
                      num_nodes=1)
    assert type(fabric.strategy) is MCCLFabricStrategy
    assert isinstance(fabric.accelerator, MPSAccelerator)
    assert fabric.strategy.root_device == torch.device("mps", 0)
    assert connector.MPSAccelerator is MPSAccelerator  # the gate is closed again for everything else
    with pytest.raises(ValueError, match="not supported on the MPS accelerator"):
        L.Fabric(strategy="ddp", accelerator=accelerator, devices=1)


def test_fabric_setup_on_mps_binds_no_device_and_creates_no_cuda_stream(mps_stand_in):
    import lightning as L

    mps_stand_in.setenv("MASTER_ADDR", "127.0.0.1")
    mps_stand_in.setenv("MASTER_PORT", str(free_port()))
    init_calls = spy_init_process_group(mps_stand_in)
    forbid_cuda_stream(mps_stand_in)
    strategy = L.Fabric(strategy="mccl", accelerator="mps", devices=1).strategy
    try:
        strategy._setup_distributed()
        assert len(init_calls) == 1 and "device_id" not in init_calls[0], init_calls
        assert dist.get_backend() == "mccl" and dist.group.WORLD.bound_device_id is None
        ddp = strategy.setup_module(torch.nn.Linear(4, 2))
        assert isinstance(ddp, DistributedDataParallel) and ddp.device_ids is None
        ddp(torch.randn(3, 4)).sum().backward()  # one real allreduce of the gradients over mccl
        assert ddp.module.weight.grad is not None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


MISSING_PEER = """
import lightning as L
from lightning_mccl.lightning.fabric import MCCLFabricStrategy
fabric = L.Fabric(strategy=MCCLFabricStrategy(timeout=4), accelerator="cpu", devices=1, num_nodes=2)
fabric.launch()
"""


def test_fabric_names_a_rank_missing_at_the_rendezvous():
    """Fabric's group goes through the strategies' rendezvous: rank 0, alone of 2, reports rank 1 (and its host)
    while it waits and fails naming it at the group timeout, as MCCLStrategy does (tests/launcher/test_rendezvous.py)."""
    env = clean_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0",
                     "MCCL_HOSTS": "mac-a,mac-b", "MCCL_RENDEZVOUS_REPORT_S": "0.5"})
    proc = subprocess.run([sys.executable, "-c", MISSING_PEER], env=env, capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "RendezvousError: rank 1 (host mac-b) did not reach the rendezvous at 127.0.0.1" in out, out
    assert "mccl rendezvous (rank 0): waiting for 1 of 2 ranks" in out, out
