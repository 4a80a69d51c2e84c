"""The recipe's copy of its configuration (LightningCLI's config.yaml) goes beside the logger's files, and
nowhere when the logger is off: never into the working directory. Two one-step fits of a one-block ViT on
one CPU rank, in this process."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "vit_finetune.py"
ONE_STEP = ["fit", "--config", str(ROOT / "configs" / "vit_local.yaml"), "--trainer.devices", "1",
            "--trainer.strategy", "auto", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "1",
            "--trainer.enable_checkpointing", "false", "--trainer.callbacks", "null",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--model.model_kwargs", '{"depth": 1}']


def _example():
    spec = importlib.util.spec_from_file_location("vit_finetune_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("logger", ["off", "csv"])
def test_the_config_is_saved_with_the_logs_and_never_into_the_working_directory(tmp_path, monkeypatch, logger):
    monkeypatch.chdir(tmp_path)
    args = ["--trainer.logger", "false"] if logger == "off" else ["--trainer.logger.init_args.save_dir", "runs"]
    _example().main(ONE_STEP + args)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("config.yaml"))
    assert written == ([] if logger == "off" else ["runs/vit_local/version_0/config.yaml"]), written
