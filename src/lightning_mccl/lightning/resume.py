"""Resuming a fit after a restart, and every rank resuming from the same checkpoint.

`mccl launch --max-restarts N` (and torchrun's) starts every rank again after a failure and tells it which
attempt it is (MCCL_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT: 0 the first time). A fit resumes when it is given
a checkpoint, so a script passes

    trainer.fit(model, ckpt_path=ckpt_path_on_restart())

which is None on the first attempt (a fresh start) and "last" on a restart: Lightning then loads the newest
last*.ckpt of the Trainer's `ModelCheckpoint`s. That finds the failed attempt's checkpoint when the callback
writes into a folder fixed for the job (`ModelCheckpoint(dirpath=...)`, as the recipe's configs do), not into
the logger's version_N folder, which is new on every attempt.

Every rank loads the checkpoint from its own disk. `check_same_checkpoint` runs when a fit sets up: a rank that
found no checkpoint (or another one) while the others resume would train from other weights and another step
count; the fit fails at once with an error naming the ranks instead.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

RESTART_VARS = ("MCCL_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")  # mccl launch's, torchrun's
LAST = "last"


def restart_count(environ: Optional[Mapping[str, str]] = None) -> int:
    """Which restart of its job this process is (0: the first attempt, or no launcher that restarts)."""
    environ = os.environ if environ is None else environ
    for name in RESTART_VARS:
        text = environ.get(name, "")
        if text.strip().isdigit():
            return int(text)
    return 0


def ckpt_path_on_restart(ckpt_path: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The `ckpt_path` for `Trainer.fit`: `ckpt_path` when given, else "last" on a restart, else None."""
    if ckpt_path is not None:
        return ckpt_path
    return LAST if restart_count(environ) > 0 else None


def check_same_checkpoint(owner: str, ckpt_path: Optional[str]) -> None:
    """RuntimeError on every rank, naming the ranks, unless every rank of the default group loaded a checkpoint
    of the same name (`ckpt_path`: the one this rank loaded, or None) or none."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return
    mine = os.path.basename(str(ckpt_path)) if ckpt_path else None
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if len(set(everyone)) == 1:
        return
    loaded = {}
    for rank, name in enumerate(everyone):
        loaded.setdefault(name or "no checkpoint", []).append(str(rank))
    said = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)}: {name}"
                     for name, ranks in loaded.items())
    raise RuntimeError(
        f"{owner}: the ranks resume from different checkpoints ({said}). Every rank loads the checkpoint from its "
        f"own disk, and Lightning writes it on rank 0's: on a fleet, keep the checkpoints in a folder every Mac "
        f"sees at the same path (ModelCheckpoint(dirpath=...) on a shared volume), or copy the job's checkpoint "
        f"folder to every Mac before resuming.")
