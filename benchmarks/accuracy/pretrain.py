"""The pretrained model that `benchmarks/convergence.py --finetune` fine-tunes: the benchmark's ViT trained once on
the glyph task, cached on disk, reused by every later run that would train the same one.

Pretraining runs in one process, through Lightning's `Trainer` with the module the ranks fit (accuracy/rank.py's
ConvergenceViT: the recipe's AdamW, weight decay, label smoothing, warm-up and cosine), on the global batch: at
each step the mean loss over `batch` images of a permutation stream seeded by the seed (rank.py's
GlobalBatchSampler with one rank). That is synchronous DDP's arithmetic, in fewer processes: DDP averages its
ranks' gradients of their mean losses, which is the gradient of the global batch's mean loss, and the ViT has
no layer that mixes samples (LayerNorm, no BatchNorm, no dropout by default); only the order of float sums
differs. One process uses the cores (or the GPU) better than N ranks sharing them, and has no launch to start.

The cache: `<cache>/<key>/backbone.pth` (the timm model's state dict, head included; the fine-tuning ranks load
it through the recipe's `checkpoint_path`, which replaces the head) and `record.json` beside it (the command,
the seed, everything the key covers, the pretraining accuracy, the time it took). The key is a digest of
everything that determines the weights: the task's parameters and the code of task.py and of this file, the
model, the steps, the batch, the learning rate and warm-up, the seed, the device, and the torch and timm
versions. The folder is written under a temporary name and renamed into place, so a run stopped while
pretraining leaves no half-written model for the next run to take.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
import torch

from .task import GlyphTask

HERE = os.path.dirname(os.path.abspath(__file__))
WEIGHTS, RECORD = "backbone.pth", "record.json"
WARMUP = 0.05  # share of the pretraining steps in warm-up
PROGRESS_LINES = 8  # log lines while pretraining


@dataclass(frozen=True)
class Pretraining:
    task: GlyphTask
    model: dict  # ConvergenceViT's arguments but num_classes and img_size (the task's): model_name, patch_size, ...
    steps: int
    batch: int  # images per step
    seed: int
    device: str

    def key(self) -> str:
        """A digest of everything that determines the weights."""
        import timm

        sources = {name: code_digest(os.path.join(HERE, name)) for name in ("task.py", "pretrain.py")}
        fields = {**asdict(self), "sources": sources, "torch": torch.__version__, "timm": timm.__version__}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (f"{self.steps} steps of {self.batch} images in one process on {self.device}, seed {self.seed}, "
                f"lr {self.model['lr']}, on {self.task.describe()}")


def code_digest(path: str) -> str:
    """A digest of a source file's code: its syntax tree less its docstrings (comments and layout are not in it),
    so that editing the prose keeps the cached models, and any change of the code does not."""
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def ensure(pre: Pretraining, cache: str, command: str, log) -> tuple:
    """(the weights' path, the record): the cached model, or a new one trained and cached now."""
    folder = os.path.join(cache, pre.key())
    path, record_path = os.path.join(folder, WEIGHTS), os.path.join(folder, RECORD)
    if os.path.isfile(path) and os.path.isfile(record_path):
        with open(record_path) as f:
            record = json.load(f)
        log(f"pretrained model: reusing {folder} ({record['pretrain_val_acc'] * 100:.2f}% on its task, "
            f"pretrained by `{record['command']}`)")
        return path, record
    log(f"pretrained model: none in {folder}; pretraining {pre.describe()}")
    start = time.perf_counter()
    model, acc = train(pre, log)
    seconds = time.perf_counter() - start
    record = {"key": os.path.basename(folder), "command": command, "seed": pre.seed,
              "pretraining": asdict(pre), "pretrain_val_acc": acc,
              "seconds": round(seconds, 1), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "torch": torch.__version__}
    partial = f"{folder}.partial-{os.getpid()}"
    os.makedirs(partial, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in model.model.state_dict().items()}, os.path.join(partial, WEIGHTS))
    with open(os.path.join(partial, RECORD), "w") as f:
        json.dump(record, f, indent=1)
    try:
        os.rename(partial, folder)
    except OSError:  # another run cached the same model meanwhile: theirs stays
        shutil.rmtree(partial)
    log(f"pretrained model: {100 * acc:.2f}% on its task after {seconds:.0f} s; cached in {folder}")
    return path, record


def train(pre: Pretraining, log) -> tuple:
    """(the trained ConvergenceViT, its accuracy on the task's validation set); `log` hears of the progress."""
    import warnings

    import lightning as L
    from lightning.pytorch import Callback
    from torch.utils.data import DataLoader, TensorDataset

    from .rank import ConvergenceViT, GlobalBatchSampler, evaluate

    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    x, y, vx, vy = pre.task.generate()
    L.seed_everything(pre.seed, verbose=False)
    model = ConvergenceViT(**pre.model, num_classes=pre.task.classes, img_size=pre.task.image_size)
    loader = DataLoader(TensorDataset(x, y), batch_sampler=GlobalBatchSampler(len(y), pre.steps, pre.batch, 0, 1,
                                                                              pre.seed))
    start, every = time.perf_counter(), max(1, pre.steps // PROGRESS_LINES)

    class Progress(Callback):
        def on_train_batch_end(self, trainer, *_) -> None:
            if trainer.global_step % every == 0:
                log(f"pretraining: step {trainer.global_step} of {pre.steps}, {time.perf_counter() - start:.0f} s")

    trainer = L.Trainer(accelerator=pre.device, devices=1, max_epochs=1, max_steps=pre.steps, limit_val_batches=0,
                        num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, use_distributed_sampler=False, callbacks=[Progress()])
    trainer.fit(model, train_dataloaders=loader)
    return model, evaluate(model, vx, vy)[0]
