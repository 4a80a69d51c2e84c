"""A fit whose traffic is known, for test_comm_metrics.py.

    python comm_metrics_script.py OUT_DIR WORLD [SLOW_RANK SLEEP_S] [--compress NAME]

Trainer(strategy="mccl", devices=WORLD) on CPU trains one bias-free Linear layer (GRAD_COUNT float32
parameters, a single DDP bucket) for STEPS steps with a CSVLogger under OUT_DIR/csv and
CommMetrics(every_n_steps=EVERY). With SLOW_RANK, that rank sleeps SLEEP_S in each training step. Every
rank writes OUT_DIR/rank<R>.json: the callback's logged history, its straggler windows, the warnings it
raised, the accuracy-cost warnings the fit raised (every one, however often) and the host names; rank 0 also
the text it printed at the end of fit (stdout is the test's). --compress: MCCLStrategy(compress=NAME).
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings

import lightning_mccl  # noqa: F401

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning.pytorch.loggers import CSVLogger

IN, OUT = 600, 500  # 300 000 parameters = 1.2 MB: above the recursive-doubling limit, divisible by 2 and 3
GRAD_COUNT = IN * OUT
STEPS = 8
EVERY = 2
BATCH = 4


class KnownGradient(L.LightningModule):
    def __init__(self, slow_rank: int, sleep_s: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(IN, OUT, bias=False)
        self.slow_rank, self.sleep_s = slow_rank, sleep_s

    def training_step(self, batch, batch_idx):
        if self.global_rank == self.slow_rank:
            time.sleep(self.sleep_s)
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        x = torch.randn(BATCH * STEPS * 3, IN, generator=torch.Generator().manual_seed(1))
        return DataLoader(TensorDataset(x), batch_size=BATCH)


def main() -> None:
    from lightning_mccl.accuracy_costs import AccuracyCostWarning
    from lightning_mccl.lightning import MCCLStrategy
    from lightning_mccl.lightning.comm_metrics import CommMetrics

    args = sys.argv[1:]
    compress = None
    if "--compress" in args:
        i = args.index("--compress")
        compress = args.pop(i + 1)
        args.pop(i)
    out_dir, world = args[0], int(args[1])
    slow_rank, sleep_s = (int(args[2]), float(args[3])) if len(args) > 3 else (-1, 0.0)
    metrics = CommMetrics(every_n_steps=EVERY)
    trainer = L.Trainer(strategy=MCCLStrategy(compress=compress), accelerator="cpu", devices=world, max_steps=STEPS,
                        callbacks=[metrics],
                        logger=CSVLogger(os.path.join(out_dir, "csv"), name="", version=""),
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(KnownGradient(slow_rank, sleep_s))
    record = {
        "history": metrics.history,
        "windows": [[w.__dict__ for w in window] for window in metrics.report.windows],
        "warnings": [str(w.message) for w in caught if "straggler" in str(w.message)],
        "cost_warnings": [str(w.message) for w in caught if issubclass(w.category, AccuracyCostWarning)],
        "hosts": metrics.hosts,
        "callbacks": [type(c).__name__ for c in trainer.callbacks].count("CommMetrics"),
        "summary": metrics.summary_text() if trainer.global_rank == 0 else "",
    }
    with open(os.path.join(out_dir, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
