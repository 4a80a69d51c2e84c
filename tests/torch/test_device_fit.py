"""A Lightning fit with Trainer(strategy="mccl") on the device under test (MPS on a Mac, the CPU here), on 2
ranks of one machine (num_nodes=2, one device each, as on a fleet of Macs). Both ranks must end with the same
weights, equal to plain full-batch gradient descent in float64 (DDP averages the two half-batch gradients)."""
import os

import pytest
import torch

from devices import DEVICES
from lightning_mccl.testing import run_ranks
from lightning_mccl.launcher import free_port

STEPS, LR = 5, 0.1


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(16, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.25


def reference():
    x, y = (t.double() for t in data())
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def fit_rank(rank, world, device, port):
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    import lightning_mccl  # noqa: F401  (registers strategy="mccl")

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK=str(rank), LOCAL_RANK="0",
                      WORLD_SIZE=str(world))

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    x, y = data()
    shard = slice(rank * 8, (rank + 1) * 8)  # each rank its half of the batch, in order
    loader = DataLoader(TensorDataset(x[shard], y[shard]), batch_size=8)
    model = Tiny()
    trainer = pl.Trainer(strategy="mccl", accelerator=device, devices=1, num_nodes=world, max_steps=STEPS,
                         use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    return {"device": str(next(model.parameters()).device.type),
            "weights": torch.cat([p.detach().flatten().cpu() for p in model.parameters()])}


@pytest.mark.parametrize("device", DEVICES)
def test_lightning_fit_with_mccl_on_device(device):
    results = run_ranks(fit_rank, 2, args=(device, free_port()), init=False, timeout=240)
    want = reference()
    for rank, r in enumerate(results):
        assert r["device"] == device, f"rank {rank} trained on {r['device']}"
        got = torch.as_tensor(r["weights"]).double()
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), f"rank {rank}: {got.tolist()} vs {want.tolist()}"
    assert (torch.as_tensor(results[0]["weights"]) == torch.as_tensor(results[1]["weights"])).all()
