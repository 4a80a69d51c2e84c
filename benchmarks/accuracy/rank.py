"""One rank of a convergence launch: the recipe's ViT trained through Lightning's `Trainer` with the method's
strategy (`MCCLStrategy` or `MCCLDiLoCoStrategy`), once per seed, in the same processes (later fits reuse the
process group).

The ranks are started as `mccl launch --local N` starts them (sweep/launch.py: torchrun's variables, one
"node" per rank), so Lightning's TorchElasticEnvironment places them: `Trainer(devices=1, num_nodes=N)`; on
cuda every rank uses GPU 0. Per seed, each rank:
- draws its part of every global batch from one permutation stream of the training set seeded by the seed:
  global batch t is the permutation's items [t G, (t + 1) G), rank r takes the r-th slice of B of them. The
  data order is therefore the same for every method, and each step's global batch is the same whatever the
  number of ranks;
- starts from the model that `seed_everything(seed)` builds (the same for every method); when fine-tuning, its
  weights but the head's replaced by the pretrained model's (the recipe's `checkpoint_path`: a new head, drawn
  from the seed), unless the method is a control that starts from random weights;
- validates every `eval_every` optimizer steps on its 1/N of the validation set and all-reduces the counts:
  for synchronous methods that is the model's accuracy; for methods whose ranks' weights differ between
  syncs (DiLoCo), the mean of the ranks' own models' accuracies;
- after fit, validates on the whole validation set alone, and records a digest of its weights, so that the
  parent can say whether the ranks ended with the same model.
Each rank writes its results, or the error that stopped it, to RESULT.rank<R>.json.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from typing import Dict, List

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback

from lightning_mccl.recipes import ViTClassifier

VAL_BATCH = 512  # validation images per forward


def worker(spec_path: str) -> None:
    """Runs the launch's spec as this rank and exits: 0 once its results are written, else with the error."""
    with open(spec_path) as f:
        spec = json.load(f)
    torch.set_num_threads(spec["threads"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    from .task import load

    _, tensors = load(spec["data"])
    path = spec["result"].replace(".json", f".rank{rank}.json")
    try:
        runs = [train_one(spec, seed, rank, world, tensors) for seed in spec["seeds"]]
    except BaseException as e:  # the parent names it in the method's status; the traceback still goes to stderr
        with open(path, "w") as f:
            json.dump({"rank": rank, "error": f"{type(e).__name__}: {e}".splitlines()[0]}, f)
        raise
    with open(path, "w") as f:
        json.dump({"rank": rank, "world": world, "runs": runs}, f)
    # Done: the group goes as the strategy's exit handler would take it, and the interpreter's teardown of
    # torch and Lightning (2-4 s a launch on the 2-core machine) is skipped.
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train_one(spec: dict, seed: int, rank: int, world: int, tensors) -> dict:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    import lightning_mccl.lightning

    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    x, y, vx, vy = tensors
    L.seed_everything(seed, verbose=False)
    model = ConvergenceViT(**{k: v for k, v in spec["model"].items()
                              if not (k == "checkpoint_path" and spec["method"]["random_init"])})
    sampler = GlobalBatchSampler(len(y), spec["steps"], spec["batch"], rank, world, seed)
    loader = DataLoader(TensorDataset(x, y), batch_sampler=sampler)
    recorder = Recorder(vx, vy, spec["eval_every"], spec["batch"] * world, rank, world)
    cls = getattr(lightning_mccl.lightning, spec["method"]["class"])
    strategy = cls(**spec["method"]["strategy"], **spec["strategy_common"])
    trainer = L.Trainer(accelerator=spec["device"], devices=1, num_nodes=world, strategy=strategy,
                        max_epochs=1, max_steps=spec["steps"], limit_val_batches=0, num_sanity_val_steps=0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False, callbacks=[recorder])
    start = time.perf_counter()
    trainer.fit(model, train_dataloaders=loader)
    seconds = time.perf_counter() - start
    acc, loss = evaluate(model, vx, vy)
    return {"seed": seed, "curve": recorder.points, "final_acc": acc, "final_loss": loss,
            "weights_sha256": weights_digest(model), "fit_s": seconds, "steps": trainer.global_step}


class GlobalBatchSampler:
    """This rank's slice of each global batch, for `steps` steps: global batch t is items [tG, (t+1)G) of a
    stream of permutations of range(n) seeded by `seed` (G = batch x world); rank r takes [rB, (r+1)B) of it."""

    def __init__(self, n: int, steps: int, batch: int, rank: int, world: int, seed: int) -> None:
        self.n, self.steps, self.batch, self.rank, self.world, self.seed = n, steps, batch, rank, world, seed

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        stream, global_batch = torch.empty(0, dtype=torch.long), self.batch * self.world
        for _ in range(self.steps):
            while len(stream) < global_batch:
                stream = torch.cat([stream, torch.randperm(self.n, generator=g)])
            mine = stream[self.rank * self.batch:(self.rank + 1) * self.batch]
            stream = stream[global_batch:]
            yield mine.tolist()


class ConvergenceViT(ViTClassifier):
    """The recipe's ViTClassifier without its per-step logging: it logs the training loss with sync_dist (an
    allreduce every step, which DiLoCo must not have) and the samples/s each epoch. It sums the training loss
    for the Recorder instead."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.train_loss_sum, self.train_loss_n = 0.0, 0

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self(images), labels, label_smoothing=self.hparams.label_smoothing)
        self.train_loss_sum, self.train_loss_n = self.train_loss_sum + loss.detach(), self.train_loss_n + 1
        return loss

    def on_train_epoch_end(self) -> None:
        pass


class Recorder(Callback):
    """Every `eval_every` optimizer steps: validation accuracy and loss over all ranks' shards (one allreduce
    of the counts), the mean training loss since the last point, and the samples seen."""

    def __init__(self, vx: torch.Tensor, vy: torch.Tensor, eval_every: int, global_batch: int, rank: int,
                 world: int) -> None:
        self.vx, self.vy = vx[rank::world], vy[rank::world]  # the parent makes the val set a multiple of world
        self.eval_every, self.global_batch = eval_every, global_batch
        self.points: List[Dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == 0 or step % self.eval_every:
            return
        correct, loss_sum = _counts(pl_module, self.vx, self.vy)
        totals = torch.tensor([correct, loss_sum, len(self.vy), float(pl_module.train_loss_sum),
                               pl_module.train_loss_n], dtype=torch.float64, device=pl_module.device)
        torch.distributed.all_reduce(totals)
        correct, loss_sum, n, train_sum, train_n = totals.tolist()
        pl_module.train_loss_sum, pl_module.train_loss_n = 0.0, 0
        self.points.append({"step": step, "samples": step * self.global_batch, "val_acc": correct / n,
                            "val_loss": loss_sum / n, "train_loss": train_sum / max(train_n, 1.0)})


def _counts(module, vx: torch.Tensor, vy: torch.Tensor):
    """(correct predictions, summed cross-entropy) of `module` on (vx, vy), in eval mode, no gradients."""
    was_training = module.training
    module.eval()
    correct, loss_sum = 0.0, 0.0
    with torch.no_grad():
        for i in range(0, len(vy), VAL_BATCH):
            images, labels = vx[i:i + VAL_BATCH].to(module.device), vy[i:i + VAL_BATCH].to(module.device)
            logits = module(images)
            correct += (logits.argmax(1) == labels).sum().item()
            loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
    module.train(was_training)
    return correct, loss_sum


def evaluate(module, vx: torch.Tensor, vy: torch.Tensor):
    """(accuracy, mean loss) of `module` on the whole validation set, on this rank alone."""
    correct, loss_sum = _counts(module, vx, vy)
    return correct / len(vy), loss_sum / len(vy)


def weights_digest(module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()
