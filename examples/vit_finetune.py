"""Fine-tune a Vision Transformer with Lightning on N local ranks, one Mac, or a fleet of Macs.

    python examples/vit_finetune.py fit --config configs/vit_local.yaml     # 2 CPU ranks over loopback
    python examples/vit_finetune.py fit --config configs/vit_mac.yaml       # one Mac (MPS)
    python examples/vit_finetune.py fit --config configs/vit_fleet24.yaml   # 24 Macs, strategy "mccl"

Everything is a LightningCLI option: `--trainer.max_epochs 5`, `--model.lr 3e-4`,
`--data.dataset cifar10`, `--ckpt_path last` (resume from the job's newest checkpoint), `--print_config`. The
data's class count and image size are passed on to the model. A fit that `mccl launch --max-restarts N` (or
torchrun) restarts resumes from the job's newest checkpoint by itself. At the end, rank 0 prints the final
validation accuracy, the wall time (from process start) and the training throughput.
"""
import time

_START = time.perf_counter()

import lightning_mccl  # noqa: E402,F401  registers the "mccl" backend and Lightning strategy
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback  # noqa: E402

from lightning_mccl.lightning import ckpt_path_on_restart  # noqa: E402
from lightning_mccl.recipes import ImageDataModule, ViTClassifier  # noqa: E402


class SaveConfigWithLogs(SaveConfigCallback):
    """LightningCLI's copy of the run's configuration, beside the logger's files (runs/NAME/version_N/config.yaml).
    With the logger off (`--trainer.logger false`) there is no run directory, and nothing is written: LightningCLI's
    own callback would write config.yaml into the working directory."""

    def setup(self, trainer, pl_module, stage):
        if trainer.logger is not None:
            super().setup(trainer, pl_module, stage)


class ViTCLI(LightningCLI):
    """LightningCLI whose model takes its class count and input size from the data, and whose fit resumes by
    itself after a restart."""

    def add_arguments_to_parser(self, parser):
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.image_size", "model.img_size")

    def before_fit(self):
        """On a restart, `--ckpt_path` defaults to "last": the job's newest checkpoint."""
        config = self.config_init[self.subcommand]
        config["ckpt_path"] = ckpt_path_on_restart(config.get("ckpt_path"))


def main(args=None):
    cli = ViTCLI(ViTClassifier, ImageDataModule, save_config_callback=SaveConfigWithLogs,
                 save_config_kwargs={"overwrite": True}, args=args)
    if cli.subcommand == "fit" and cli.trainer.is_global_zero:
        model, trainer = cli.model, cli.trainer
        acc = trainer.callback_metrics.get("val/acc")
        throughput = model.train_samples / model.train_time_s if model.train_time_s > 0 else float("nan")
        accuracy = float(acc) if acc is not None else float("nan")
        print(f"final val/acc {accuracy:.4f} after {trainer.current_epoch} epochs on {trainer.world_size} rank(s) "
              f"({type(trainer.strategy).__name__}, weights: {model.weights_source}); "
              f"wall time {time.perf_counter() - _START:.1f} s; training {throughput:.0f} samples/s")
    return cli


if __name__ == "__main__":
    main()
