"""A Lightning fit as a rank of `mccl launch` (the launcher tests for Lightning's side of the contract).

    python lightning_rank.py NUM_NODES DIR [--long] [--devices D]   # Trainer(strategy="mccl", num_nodes=NUM_NODES,
                                                                    # devices=D), D default 1

on CPU, 2 steps (with --long: for minutes, until stopped). Writes DIR/ready-<RANK> (the time, once the
imports are done: what follows must be fast) and, with --long, DIR/training-<rank> after its second step.
"""
import os
import sys
import time

import lightning_mccl  # noqa: F401  (registers the strategy)

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L


class Tiny(L.LightningModule):
    def __init__(self, marker_dir=None):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.marker_dir = marker_dir

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        if self.marker_dir and batch_idx == 1:
            open(os.path.join(self.marker_dir, f"training-{self.global_rank}"), "w").close()
        if self.marker_dir:
            time.sleep(0.02)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv):
    num_nodes, out_dir = int(argv[0]), argv[1]
    devices = int(argv[argv.index("--devices") + 1]) if "--devices" in argv else 1
    with open(os.path.join(out_dir, f"ready-{os.environ['RANK']}"), "w") as f:
        f.write(repr(time.time()))
    marker_dir = out_dir if "--long" in argv else None
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(strategy="mccl", accelerator="cpu", devices=devices, num_nodes=num_nodes,
                        max_steps=100_000 if marker_dir else 2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(marker_dir), DataLoader(data, batch_size=4))
    print(f"rank {trainer.global_rank} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
