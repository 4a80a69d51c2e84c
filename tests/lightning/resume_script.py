"""A Lightning fit that can be killed and resumed, for test_resume_after_kill.py. Run it under
`mccl launch --local 1 --nproc-per-node 2 [--max-restarts 1] -- python resume_script.py OUT_DIR [KILL_AT] [--diloco |
--diloco-auto | --diloco-short]`.

Trains a tiny deterministic model (2 CPU ranks, strategy="mccl", SGD with momentum, a shuffled dataset:
the order depends on the epoch) for EPOCHS epochs of STEPS_PER_EPOCH steps, checkpointing at the end of
every epoch into OUT_DIR/ckpt (save_last). Every attempt resumes from OUT_DIR/ckpt/last.ckpt when there is
one (ckpt_path="last"). With KILL_AT, on the first attempt (MCCL_RESTART_COUNT=0) rank 1 SIGKILLs itself
when it is about to run global step KILL_AT, mid-epoch. At the end every rank writes
OUT_DIR/final.rank<R>.pt: its parameters and SGD momentum buffers; every attempt appends to
OUT_DIR/attempts.rank<R>.txt the global step it started at.

Why end-of-epoch checkpoints: resuming a checkpoint taken mid-epoch is exact only with a resumable data
loader (Lightning then replays the epoch's remaining batches); at an epoch boundary any loader is exact.

--diloco: the strategy is MCCLDiLoCoStrategy(sync_every=3, sync_delay=2, compress="bf16", fragments=1) (the
whole model at each round's end), so the checkpoint at the end of epoch 1 (step 10) is mid-round with the sync
of step 9 in flight. --diloco-auto: the same with the default fragments="auto" (a checkpoint's count taken).
The first attempt first runs the same fit without a kill in the same processes (into OUT_DIR/reference), and
every DiLoCo fit records, after each training step: the allreduces the step ran on the default group, the outer
group's allreduce count, a checksum of the anchor and its wire type (steps.rank<R>.txt in its directory); its
CommMetrics (every 5 steps) count the outer group: the wire type they read and the bytes per step of each window
go into final.rank<R>.pt.

--diloco-short: the same with DiLoCo's options for short jobs, DILOCO_SHORT, and an inner learning rate that falls
every step (a LambdaLR stepped per step): 3 synchronous steps, then the H schedule's rounds (2 steps, then 4, its
cap) in 2 fragments, so the checkpoint at step 10 has the second fragment's sync of step 9 in flight (applied at 11).
"""
from __future__ import annotations

import os
import signal
import sys
import zlib

import lightning_mccl  # noqa: F401  (registers the backend and the "mccl" strategy)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

EPOCHS = 3
BATCH = 4
STEPS_PER_EPOCH = 5
SAMPLES = 2 * BATCH * STEPS_PER_EPOCH  # 2 ranks
IN, HID, OUT = 8, 16, 3
DILOCO_AUTO = dict(sync_every=3, sync_delay=2, compress="bf16")
DILOCO = dict(DILOCO_AUTO, fragments=1)
DILOCO_SHORT = dict(sync_every=2, sync_delay=2, compress="bf16", warm_start=3, fragments=2, qsr_alpha=0.1,
                    max_sync_every=4)


def allreduces(group=None) -> int:
    return lightning_mccl.stats(group)["kinds"].get("allreduce", {}).get("calls", 0)


class Resumable(L.LightningModule):
    def __init__(self, out_dir: str, kill_at: int | None, falling_lr: bool = False) -> None:
        super().__init__()
        self.falling_lr = falling_lr
        torch.manual_seed(1234)
        self.net = nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, OUT))
        self.out_dir, self.kill_at = out_dir, kill_at
        self.attempt = int(os.environ.get("MCCL_RESTART_COUNT", "0"))
        self.steps = []  # DiLoCo: per training step (default-group allreduces, outer allreduces, anchor crc)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_start(self) -> None:
        with open(os.path.join(self.out_dir, f"attempts.rank{self.global_rank}.txt"), "a") as f:
            f.write(f"attempt {self.attempt} started at global step {self.global_step}\n")

    def on_train_batch_start(self, batch, batch_idx) -> None:
        first_attempt = self.attempt == 0
        if first_attempt and self.global_rank == 1 and self.kill_at is not None and self.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        self._default_before = allreduces()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        diloco = getattr(self.trainer.strategy, "diloco", None)  # MCCLDiLoCoStrategy only
        if diloco is not None:
            anchor = zlib.crc32(diloco.anchor.numpy().tobytes())
            self.steps.append((self.global_step, allreduces() - self._default_before,
                               allreduces(self.trainer.strategy.outer_group), anchor,
                               lightning_mccl.backend.wire_dtype_of(self.trainer.strategy.outer_group)))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        if not self.falling_lr:
            return optimizer
        falling = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.2 * step))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": falling, "interval": "step"}}

    def train_dataloader(self):
        g = torch.Generator().manual_seed(99)
        x = torch.randn(SAMPLES, IN, generator=g)
        y = torch.randn(SAMPLES, OUT, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)


def fit(out_dir: str, kill_at, diloco: dict | None) -> None:
    from lightning_mccl.lightning import CommMetrics, MCCLDiLoCoStrategy

    model = Resumable(out_dir, kill_at, falling_lr=diloco is DILOCO_SHORT)
    metrics = CommMetrics(every_n_steps=5, summary=False)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    checkpoint = ModelCheckpoint(dirpath=os.path.join(out_dir, "ckpt"), save_last=True, save_top_k=-1,
                                 every_n_epochs=1, filename="{epoch}")
    trainer = L.Trainer(strategy=MCCLDiLoCoStrategy(**diloco, comm_metrics=metrics) if diloco else "mccl",
                        accelerator="cpu", devices=2,
                        max_epochs=EPOCHS, logger=False, callbacks=[checkpoint], enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    trainer.fit(model, ckpt_path="last")
    optimizer = trainer.optimizers[0]
    rank = trainer.global_rank
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "momentum": [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()],
                "initial": initial, "global_step": trainer.global_step,
                "comm_wire": metrics._backend.wire_dtype if diloco else None,
                "comm_bytes_per_step": [h["bytes_per_step"] for h in metrics.history]},
               os.path.join(out_dir, f"final.rank{rank}.pt"))
    if diloco:
        with open(os.path.join(out_dir, f"steps.rank{rank}.txt"), "a") as f:
            f.writelines(f"{' '.join(map(str, step))}\n" for step in model.steps)


def main() -> None:
    modes = {"--diloco": DILOCO, "--diloco-auto": DILOCO_AUTO, "--diloco-short": DILOCO_SHORT}
    args = [a for a in sys.argv[1:] if a not in modes]
    diloco = next((modes[a] for a in sys.argv[1:] if a in modes), None)
    out_dir = args[0]
    kill_at = int(args[1]) if len(args) > 1 else None
    reference = os.path.join(out_dir, "reference")
    if diloco and kill_at is not None and int(os.environ.get("MCCL_RESTART_COUNT", "0")) == 0:
        os.makedirs(reference, exist_ok=True)
        fit(reference, None, diloco)
    fit(out_dir, kill_at, diloco)


if __name__ == "__main__":
    main()
