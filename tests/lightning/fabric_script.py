"""One Fabric training loop, for test_fabric.py: `python fabric_script.py OUT_DIR RUN`.

    ddp        Fabric(strategy="ddp", devices=2)                     Fabric's DDP over Gloo: the reference
    mccl       Fabric(strategy="mccl", devices=2)
    instance   Fabric(strategy=MCCLFabricStrategy(timeout=120), accelerator="auto", devices=2)
    nodes      Fabric(strategy="mccl", num_nodes=2, devices=1), started by `mccl launch --local 2
               --nproc-per-node 1` (2 nodes)

Each trains the same tiny deterministic model for STEPS steps on CPU (a DistributedSampler splits the data)
and every rank writes OUT_DIR/RUN.rank<R>.pt: the final parameters, the backend, the strategy class, the
world size, and the engine's allreduce count (what really carried the gradients).
"""
from __future__ import annotations

import os
import sys

import lightning_mccl  # noqa: F401

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L

STEPS, BATCH, IN, HID, OUT = 6, 4, 8, 16, 3


def make_fabric(run: str) -> L.Fabric:
    from lightning_mccl.lightning import MCCLFabricStrategy

    if run == "ddp":
        return L.Fabric(strategy="ddp", accelerator="cpu", devices=2)
    if run == "mccl":
        return L.Fabric(strategy="mccl", accelerator="cpu", devices=2)
    if run == "instance":
        return L.Fabric(strategy=MCCLFabricStrategy(timeout=120), accelerator="auto", devices=2)
    if run == "nodes":
        return L.Fabric(strategy="mccl", accelerator="cpu", devices=1, num_nodes=2)
    raise SystemExit(f"fabric_script.py: unknown run {run!r}")


def main() -> None:
    out_dir, run = sys.argv[1], sys.argv[2]
    fabric = make_fabric(run)
    fabric.launch()
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, OUT))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(99)
    data = TensorDataset(torch.randn(2 * BATCH * STEPS, IN, generator=g), torch.randn(2 * BATCH * STEPS, OUT, generator=g))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=BATCH, shuffle=False))
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    allreduces = None
    if dist.get_backend() == "mccl":
        allreduces = lightning_mccl.stats()["kinds"]["allreduce"]["calls"]
    record = {
        "params": {k: v.detach().cpu().clone() for k, v in model.module.state_dict().items()},
        "backend": dist.get_backend(),
        "strategy": type(fabric.strategy).__name__,
        "world_size": fabric.world_size,
        "allreduces": allreduces,
    }
    torch.save(record, os.path.join(out_dir, f"{run}.rank{fabric.global_rank}.pt"))


if __name__ == "__main__":
    main()
