"""A Lightning fit as a rank of `mccl launch` (the launcher tests for Lightning's side of the contract).

    python lightning_rank.py NUM_NODES DIR [--long] [--devices D]   # Trainer(strategy="mccl", num_nodes=NUM_NODES,
                                                                    # devices=D), D default 1
    python lightning_rank.py NUM_NODES DIR --progress              # Lightning's own progress bar, and the loss
                                                                    # on it: 2 epochs of PROGRESS_STEPS slow steps
                                                                    # in all

on CPU, 2 steps (with --long: for minutes, until stopped). Writes DIR/ready-<RANK> (the time, once the
imports are done: what follows must be fast), with --long DIR/training-<rank> after its second step, and
with --progress DIR/fit-ended-<RANK> (the time trainer.fit returned).
"""
import os
import sys
import time

import lightning_mccl  # noqa: F401  (registers the strategy)

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L


PROGRESS_STEPS = 40
PROGRESS_STEP_S = 0.15


class Tiny(L.LightningModule):
    def __init__(self, marker_dir=None, step_s=0.0):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.marker_dir = marker_dir
        self.step_s = step_s

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        if self.marker_dir and batch_idx == 1:
            open(os.path.join(self.marker_dir, f"training-{self.global_rank}"), "w").close()
        if self.marker_dir:
            time.sleep(0.02)
        if self.step_s:
            time.sleep(self.step_s)
            self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv):
    num_nodes, out_dir = int(argv[0]), argv[1]
    devices = int(argv[argv.index("--devices") + 1]) if "--devices" in argv else 1
    with open(os.path.join(out_dir, f"ready-{os.environ['RANK']}"), "w") as f:
        f.write(repr(time.time()))
    marker_dir = out_dir if "--long" in argv else None
    progress = "--progress" in argv
    n = 4 * PROGRESS_STEPS if progress else 64
    data = TensorDataset(torch.randn(n, 4), torch.randn(n, 1))
    steps = dict(max_epochs=2) if progress else dict(max_steps=100_000 if marker_dir else 2)
    trainer = L.Trainer(strategy="mccl", accelerator="cpu", devices=devices, num_nodes=num_nodes, **steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=progress, enable_model_summary=False)
    trainer.fit(Tiny(marker_dir, PROGRESS_STEP_S if progress else 0.0), DataLoader(data, batch_size=4))
    if progress:
        with open(os.path.join(out_dir, f"fit-ended-{os.environ['RANK']}"), "w") as f:
            f.write(repr(time.time()))
    print(f"rank {trainer.global_rank} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
