"""Rank programs that fail the ways a newcomer's first runs fail, for the launcher's first-error tests.

    python error_rank.py cli ARGS...      # a LightningCLI fit (Tiny, CheckedStrategy registered); ARGS: its options
    python error_rank.py cifar DIR        # the recipe's CIFAR-10 with no copy in DIR and a download that fails
                                          # (its address does not resolve, whatever the network)
    python error_rank.py peer             # a 2-rank mccl fit whose rank 0 raises at its fourth step

`CheckedStrategy(every=0)` raises the project's ValueError while LightningCLI instantiates the Trainer's
strategy, as MCCLStrategy's own checks do: jsonargparse reports it inside an error of its own.
"""
import os
import sys

import lightning_mccl  # noqa: F401  (registers the strategy)

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning.pytorch.strategies import DDPStrategy


class CheckedStrategy(DDPStrategy):
    def __init__(self, every: int = 1, **kwargs):
        if every < 1:
            raise ValueError(f"CheckedStrategy(every={every}): expected the steps per round, an int >= 1")
        super().__init__(**kwargs)


class Tiny(L.LightningModule):
    def __init__(self, fail_at: int = -1):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at and self.global_rank == 0:
            raise ValueError(f"Tiny: step {batch_idx} failed on rank 0 on purpose")
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def cli(args):
    from lightning.pytorch.cli import LightningCLI

    sys.modules.setdefault("error_rank", sys.modules[__name__])  # class_path error_rank.CheckedStrategy
    LightningCLI(Tiny, args=["fit", *args], trainer_defaults=dict(accelerator="cpu", logger=False,
                                                                  enable_checkpointing=False, max_steps=2))


def cifar(out_dir):
    from torchvision.datasets import CIFAR10

    from lightning_mccl.recipes.data import ImageDataModule

    CIFAR10.url = "https://cifar.invalid/cifar-10-python.tar.gz"  # .invalid never resolves (RFC 2606)
    ImageDataModule(dataset="cifar10", data_dir=os.path.join(out_dir, "cifar10")).prepare_data()


def peer():
    trainer = L.Trainer(strategy="mccl", accelerator="cpu", devices=1, num_nodes=2, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(fail_at=3))


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    {"cli": lambda: cli(rest), "cifar": lambda: cifar(rest[0]), "peer": peer}[mode]()
