"""A callback for test_restart_resume.py, given to the recipe on its command line
(`--trainer.callbacks+=recipe_kill.KillRank`, with tests/recipes on PYTHONPATH).

Every fit appends to OUT_DIR/attempts.rank<R>.txt the attempt (MCCL_RESTART_COUNT) and the epoch and global step
it starts training at. In a fit that started from scratch (no checkpoint loaded), rank `rank` SIGKILLs itself as
epoch `epoch` starts: after `epoch` whole epochs, each ended by its checkpoint."""
from __future__ import annotations

import os
import signal

from lightning.pytorch.callbacks import Callback


class KillRank(Callback):
    def __init__(self, out_dir: str, epoch: int = 2, rank: int = 1) -> None:
        self.out_dir, self.epoch, self.rank = out_dir, epoch, rank

    def on_train_start(self, trainer, pl_module) -> None:
        attempt = os.environ.get("MCCL_RESTART_COUNT", "-")
        with open(os.path.join(self.out_dir, f"attempts.rank{trainer.global_rank}.txt"), "a") as f:
            f.write(f"attempt {attempt} started at epoch {trainer.current_epoch}, step {trainer.global_step}\n")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.ckpt_path is None and trainer.global_rank == self.rank and trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)
