"""One member of the Lightning elastic tests: elastic_rank.py's linear regression, fit by a Lightning Trainer
with `MCCLElasticStrategy` (the same data, model, optimizer and global batch, so test_churn.py's float64 replay
checks it), or with `MCCLElasticDiLoCoStrategy` when ELASTIC_SYNC_EVERY is set.

Started by `mccl launch --local N --elastic` (or `mccl join`), it writes <ELASTIC_OUT>/<member>.json when fit
returns: its final weights and momentum, each epoch's ledger, Lightning's counters (global_step, current_epoch),
and per batch the committed steps, `trainer.world_size`, `trainer.global_rank` and its own number of samples; host 0
logs (CSVLogger, <ELASTIC_OUT>/logs/version_0/metrics.csv) the loss and CommMetrics' members and shares. As
each elastic step (a round under DiLoCo) commits, it appends the step and the member's sample ids to
<ELASTIC_OUT>/<member>.steps.jsonl, so a member killed later leaves what it trained. Scenario variables (as
elastic_rank.py's):

- ELASTIC_PAUSES: "m1:5,m0:18": each member named writes <out>/paused-<member> in its training_step at that step
  (the committed steps before it) and waits until <out>/go-<member> exists or it was asked to leave;
- ELASTIC_SAMPLE_S, ELASTIC_SLOW_MEMBER, ELASTIC_SLOW_FROM: every member's step sleeps ELASTIC_SAMPLE_S per sample
  it was dealt, that member's twice as long from that step on;
- ELASTIC_AWAIT_JOIN_AT: at that step every launched member writes <out>/awaiting-join and waits until j1 has
  posted at the step's boundary;
- ELASTIC_SYNC_EVERY: elastic DiLoCo with that H (outer lr 1, no outer momentum); ELASTIC_MOMENTUM: the inner SGD's
  momentum (default MOMENTUM);
- ELASTIC_GLOBAL_BATCH: the strategy's global_batch (default GLOBAL_BATCH, the DataLoader's batch_size x 4);
- ELASTIC_CHECKPOINT: a folder: a checkpoint there at every epoch's end (ModelCheckpoint, last.ckpt), and the fit
  resumes from its last.ckpt when it exists.
"""
from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

import lightning_mccl  # noqa: F401  (registers "mccl_elastic")
from elastic_rank import (EPOCHS, FEATURES, GLOBAL_BATCH, LR, MOMENTUM, NUM_SAMPLES, SETTINGS, dataset, final_state,
                          run, wait_until)
from lightning_mccl.lightning import MCCLElasticDiLoCoStrategy, MCCLElasticStrategy

MEMBERS = 4  # the launched members: the DataLoader's batch_size x MEMBERS is the global batch


class Samples(Dataset):
    def __init__(self):
        x, y = dataset()
        self.x, self.y = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)

    def __len__(self):
        return NUM_SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


class Regression(pl.LightningModule):
    def __init__(self, out: Path):
        super().__init__()
        torch.manual_seed(int(os.environ.get("RANK", "99")))  # different on every member: host 0's state wins
        self.net = torch.nn.Linear(FEATURES, 1)
        self.out = out
        self.env = os.environ

    def _manager(self):
        return self.trainer.strategy.manager

    def training_step(self, batch, batch_idx):
        x, y, ids = batch
        manager, env = self._manager(), self.env
        step, me = manager.step, manager.me
        pauses = dict(p.split(":") for p in env.get("ELASTIC_PAUSES", "").split(",") if p)
        if me in pauses and step == int(pauses[me]) and not (self.out / f"paused-{me}").exists():
            (self.out / f"paused-{me}").write_text(str(time.time()))
            wait_until(lambda: (self.out / f"go-{me}").exists() or manager.leave_requested)
        if manager.me.startswith("m") and step == int(env.get("ELASTIC_AWAIT_JOIN_AT", "-1")) \
                and not (self.out / "awaiting-join").exists():
            (self.out / "awaiting-join").write_text(str(time.time()))
            wait_until(lambda: manager.board.has([f"round/{manager.membership.round}/post/j1"]))
        slow = manager.me == env.get("ELASTIC_SLOW_MEMBER") and step >= int(env.get("ELASTIC_SLOW_FROM", "0"))
        time.sleep(float(env.get("ELASTIC_SAMPLE_S", "0")) * len(ids) * (2 if slow else 1))
        loss = ((self.net(x).squeeze(1) - y) ** 2).sum() / max(len(ids), 1)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=float(self.env.get("ELASTIC_MOMENTUM", MOMENTUM)))

    def train_dataloader(self):
        return DataLoader(Samples(), batch_size=GLOBAL_BATCH // MEMBERS, shuffle=True)


class Record(Callback):
    """What the test checks, into <out>/<member>.json at the end of fit."""

    def __init__(self, out: Path):
        self.out = out
        self.record = {"batches": [], "ledgers": {}, "initial": None}

    def on_train_start(self, trainer, module):
        self.record["initial"] = [p.detach().double().flatten().tolist() for p in module.parameters()]
        self.record["first_step"] = trainer.global_step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        strategy = trainer.strategy
        manager = strategy.manager
        if strategy.batches.step_ends:  # the step (round) committed: what this member trained in it
            with open(self.out / f"{manager.me}.steps.jsonl", "a") as f:
                f.write(json.dumps({"step": manager.step - 1, "ids": strategy.step.ids.tolist()}) + "\n")
        self.record["batches"].append({"step": manager.step, "global_step": trainer.global_step,
                                       "epoch": trainer.current_epoch, "world_size": trainer.world_size,
                                       "global_rank": trainer.global_rank, "samples": len(batch[2]),
                                       "is_global_zero": trainer.is_global_zero})

    def on_train_epoch_end(self, trainer, module):
        sampler = trainer.strategy.manager.sampler
        if sampler.epoch_done:
            self.record["ledgers"][str(sampler.epoch)] = sampler.ledger().tolist()


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    warnings.filterwarnings("ignore")
    out = Path(os.environ["ELASTIC_OUT"])
    record = Record(out)
    callbacks = [record]
    checkpoints = os.environ.get("ELASTIC_CHECKPOINT")
    if checkpoints:
        callbacks.append(ModelCheckpoint(dirpath=checkpoints, save_last=True, every_n_epochs=1))
    arguments = dict(settings=SETTINGS, seed=7, global_batch=int(os.environ.get("ELASTIC_GLOBAL_BATCH", GLOBAL_BATCH)))
    sync_every = os.environ.get("ELASTIC_SYNC_EVERY")
    strategy = (MCCLElasticDiLoCoStrategy(sync_every=int(sync_every), **arguments) if sync_every
                else MCCLElasticStrategy(**arguments))
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=MEMBERS, num_nodes=1, max_epochs=EPOCHS,
                         callbacks=callbacks, logger=CSVLogger(out, name="logs", version=0), log_every_n_steps=1,
                         enable_checkpointing=bool(checkpoints),
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    model = Regression(out)
    resume = Path(checkpoints) / "last.ckpt" if checkpoints else None
    trainer.fit(model, ckpt_path=str(resume) if resume is not None and resume.exists() else None)
    manager = strategy.manager
    record.record.update(
        member=manager.me, left=manager.left, steps=manager.step, global_step=trainer.global_step,
        current_epoch=trainer.current_epoch, finished_at=time.time(), **final_state(model, trainer.optimizers[0]))
    (out / f"{manager.me}.json").write_text(json.dumps(record.record))
    return 0


if __name__ == "__main__":
    run(main)
