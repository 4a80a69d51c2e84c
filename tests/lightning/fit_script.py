"""One script, every way of starting a Lightning fit that test_strategy_fits.py compares.

    python fit_script.py OUT_DIR RUN [RUN ...] [--lightning-first]

Each RUN trains the same tiny deterministic model for STEPS steps on 2 CPU ranks and every rank writes
OUT_DIR/RUN.rank<R>.pt: the final parameters plus what the run really used (torch.distributed backend,
strategy and cluster-environment classes, the DDP comm hooks, world size, the wire type the default group
read and MCCL_WIRE_DTYPE in the environment, whether the process group was still there after fit); at exit, OUT_DIR/exit.rank<R>.pt says whether the group was still there once the
other exit handlers had run. RUNs execute in order in the same processes, so later ones also exercise a
second fit in the same process.

    ddp                  Trainer(strategy="ddp")                   Lightning's own DDP over Gloo: the reference
    gloo_bf16            MCCLStrategy(process_group_backend="gloo", compress="bf16"): reference for the next
    mccl                 Trainer(strategy="mccl")
    mccl_bf16_compress   Trainer(strategy="mccl_bf16_compress"): the engine's bf16 wire compression (its
                         group reads MCCL_WIRE_DTYPE from its pg_options when it is made)
    mccl_after_destroy   torch.distributed.destroy_process_group(), then Trainer(strategy="mccl"): after
                         mccl_bf16_compress, a new group that reads its own (uncompressed) wire type
    mccl_bf16_hook       MCCLStrategy(compress="bf16_hook"): torch's hook, like gloo_bf16
    mccl_powersgd        MCCLStrategy(compress="powersgd", PowerSGD from step 2); gloo_powersgd: over Gloo
    instance             Trainer(strategy=MCCLStrategy(timeout=120), accelerator="auto")
    cli_string           LightningCLI: --trainer.strategy mccl
    cli_class_path       LightningCLI: --trainer.strategy.class_path lightning_mccl.lightning.MCCLStrategy

Run it directly (Lightning's launcher starts rank 1) or under torchrun with --nproc-per-node 2.
By default `lightning_mccl` is imported before Lightning (its strategies are registered by the import hook);
--lightning-first reverses the order. Either way the names must be registered before the script imports
anything from lightning_mccl.lightning (recorded as registered_by_import).
"""
from __future__ import annotations

import atexit
import os
import sys

LIGHTNING_FIRST = "--lightning-first" in sys.argv
if LIGHTNING_FIRST:
    import lightning  # noqa: F401
import lightning_mccl  # noqa: E402,F401

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lightning as L  # noqa: E402
from lightning.pytorch.strategies import StrategyRegistry  # noqa: E402

# Nothing below has imported lightning_mccl.lightning yet: the names come from `import lightning_mccl` alone, and
# registering them loaded no strategy module (each name imports its class when first used).
REGISTERED_BY_IMPORT = ("mccl" in StrategyRegistry and "mccl_diloco" in StrategyRegistry
                        and "lightning_mccl.lightning.strategy" not in sys.modules)

STEPS = 6
BATCH = 4
SAMPLES = 2 * BATCH * STEPS
IN, HID, OUT = 8, 16, 3
LR = 0.1


class TinyModel(L.LightningModule):
    def __init__(self, lr: float = LR) -> None:
        super().__init__()
        self.lr = lr
        torch.manual_seed(1234)
        self.net = nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, OUT))
        self.used = {}

    def prepare_data(self) -> None:
        """Overridden, so that Lightning runs it inside its `_InfiniteBarrier`: a Gloo group beside the default one."""

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def on_train_start(self) -> None:
        ddp = self.trainer.strategy.model
        self.used = {
            "backend": torch.distributed.get_backend(),
            "world_size": torch.distributed.get_world_size(),
            "comm_hooks": [hook.__qualname__ for hook, _ in getattr(ddp, "_comm_hooks", [])],
            "bound_device_id": str(torch.distributed.group.WORLD.bound_device_id),
            "engine_wire": lightning_mccl.backend.wire_dtype_of(),
            "wire_env": os.environ.get("MCCL_WIRE_DTYPE"),
        }

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.5)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(99)
        x = torch.randn(SAMPLES, IN, generator=g)
        y = torch.randn(SAMPLES, OUT, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)


TRAINER_ARGS = dict(
    devices=2,
    max_steps=STEPS,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)


def fit_trainer(strategy, accelerator: str = "cpu"):
    model = TinyModel()
    trainer = L.Trainer(strategy=strategy, accelerator=accelerator, **TRAINER_ARGS)
    trainer.fit(model)
    return trainer, model


def fit_cli(strategy_args: list):
    from lightning.pytorch.cli import LightningCLI

    args = ["fit", "--trainer.accelerator=cpu"] + [f"--trainer.{k}={v}" for k, v in TRAINER_ARGS.items()]
    cli = LightningCLI(TinyModel, args=args + strategy_args, save_config_callback=None)
    return cli.trainer, cli.model


def run(name: str):
    from lightning_mccl.lightning import MCCLStrategy

    if name == "ddp":
        return fit_trainer("ddp")
    if name == "gloo_bf16":
        return fit_trainer(MCCLStrategy(process_group_backend="gloo", compress="bf16"))
    if name in ("mccl", "mccl_bf16_compress"):
        return fit_trainer(name)
    if name == "mccl_after_destroy":  # a new group after the last one was destroyed: its own settings
        torch.distributed.destroy_process_group()
        return fit_trainer("mccl")
    if name == "mccl_bf16_hook":
        return fit_trainer(MCCLStrategy(compress="bf16_hook"))
    if name in ("mccl_powersgd", "gloo_powersgd"):
        return fit_trainer(MCCLStrategy(process_group_backend=name.split("_")[0], compress="powersgd",
                                        compress_options={"start_powerSGD_iter": 2}))
    if name == "instance":
        return fit_trainer(MCCLStrategy(timeout=120), accelerator="auto")
    if name == "cli_string":
        return fit_cli(["--trainer.strategy=mccl"])
    if name == "cli_class_path":
        return fit_cli([
            "--trainer.strategy.class_path=lightning_mccl.lightning.MCCLStrategy",
            "--trainer.strategy.init_args.timeout=120",
            "--trainer.strategy.init_args.find_unused_parameters=false",
        ])
    raise SystemExit(f"fit_script.py: unknown run {name!r}")


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--lightning-first"]
    out_dir, runs = args[0], args[1:]
    rank = 0  # of this process, once a fit has said it
    completed = False

    @atexit.register  # registered first, so it runs after every handler registered during the fits
    def record_exit():
        initialized = torch.distributed.is_initialized()
        torch.save({"initialized_at_exit": initialized}, os.path.join(out_dir, f"exit.rank{rank}.pt"))
        # Lightning leaves its Gloo group to interpreter shutdown, where Gloo's threads can abort a process
        # that has done everything ("terminate called without an active exception", pytorch/pytorch#190489;
        # about 1 run of the reference in 8 here, with this session's tree and the one before it). A run that
        # completed ends here, before that teardown; one that failed keeps its exit status. Runs whose group
        # was destroyed (mccl's, at exit) go through the whole teardown.
        if initialized and completed:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    for name in runs:
        trainer, model = run(name)
        rank = trainer.global_rank
        record = {
            "params": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
            "strategy": type(trainer.strategy).__name__,
            "environment": type(trainer.strategy.cluster_environment).__name__,
            "process_group_after_fit": torch.distributed.is_initialized(),
            "global_rank": trainer.global_rank,
            "lightning_first": LIGHTNING_FIRST,
            "registered_by_import": REGISTERED_BY_IMPORT,
            **model.used,
        }
        torch.save(record, os.path.join(out_dir, f"{name}.rank{trainer.global_rank}.pt"))
    if rank == 0:
        torch.save({k: v.clone() for k, v in TinyModel().state_dict().items()}, os.path.join(out_dir, "init.pt"))
    completed = True


if __name__ == "__main__":
    main()
