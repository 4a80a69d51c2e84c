"""MCCLStrategy on an MPS stand-in, in this process (no fit): MPS is reported available the way Lightning's
own tests do it. Lightning refuses its DDP there (checked, so the stand-in is known to work); MCCLStrategy
passes the connector as a name and as an instance, and through LightningCLI; with a real one-rank mccl group
it initialises without device_id, wraps the model without a CUDA stream, registers its comm hook (which then
runs) and has its group destroyed at exit. Lightning's DDPStrategy is shown doing each of those things."""

from __future__ import annotations

import sys
import textwrap
from datetime import timedelta
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from lightning_mccl.launcher import free_port
from spies import forbid_cuda_stream, spy_init_process_group


def make_trainer(strategy, accelerator, root, **kwargs):
    import lightning as L

    return L.Trainer(strategy=strategy, accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root), **kwargs)


def test_lightning_refuses_its_ddp_on_the_mps_stand_in(mps_stand_in, tmp_path):
    """Obstacle (a) as Lightning has it: the stand-in really makes the connector see MPS."""
    from lightning.pytorch.strategies import DDPStrategy

    for strategy in ("ddp", "ddp_spawn", DDPStrategy()):
        for accelerator in ("mps", "auto"):
            with pytest.raises(ValueError, match="not supported on the MPS accelerator"):
                make_trainer(strategy, accelerator, tmp_path)


@pytest.mark.parametrize("accelerator", ["mps", "auto"])
@pytest.mark.parametrize("strategy", ["mccl", "mccl_bf16_compress", "instance"])
def test_mccl_passes_the_connector_on_mps(mps_stand_in, tmp_path, strategy, accelerator):
    from lightning.pytorch.accelerators import MPSAccelerator
    from lightning.pytorch.strategies import DDPStrategy
    from lightning.pytorch.trainer.connectors import accelerator_connector

    from lightning_mccl.lightning import MCCLStrategy

    trainer = make_trainer(MCCLStrategy(compress="fp16") if strategy == "instance" else strategy, accelerator, tmp_path)
    assert type(trainer.strategy) is MCCLStrategy
    assert isinstance(trainer.accelerator, MPSAccelerator)
    assert trainer.strategy.root_device == torch.device("mps", 0)
    assert trainer.strategy.process_group_backend == "mccl"
    assert trainer.strategy.determine_ddp_device_ids() is None
    # the gate is closed again for everybody else
    assert accelerator_connector.MPSAccelerator is MPSAccelerator
    with pytest.raises(ValueError, match="not supported on the MPS accelerator"):
        make_trainer(DDPStrategy(), accelerator, tmp_path)


def test_lightning_cli_on_mps_string_and_class_path(mps_stand_in, tmp_path):
    from lightning.pytorch.accelerators import MPSAccelerator
    from lightning.pytorch.cli import LightningCLI

    from fit_script import TinyModel
    from lightning_mccl.lightning import MCCLStrategy

    common = ["--trainer.accelerator=mps", "--trainer.devices=1", "--trainer.logger=false",
              f"--trainer.default_root_dir={tmp_path}"]
    config = tmp_path / "config.yaml"
    config.write_text(textwrap.dedent("""
        trainer:
          strategy:
            class_path: lightning_mccl.lightning.MCCLStrategy
            init_args:
              compress: bf16
              timeout: 60
    """))
    with mock.patch.object(sys, "argv", ["train.py"]):
        cli = LightningCLI(TinyModel, run=False, save_config_callback=None, args=common + [f"--config={config}"])
        strategy = cli.trainer.strategy
        assert type(strategy) is MCCLStrategy and isinstance(cli.trainer.accelerator, MPSAccelerator)
        assert (strategy.compress, strategy._ddp_comm_hook, strategy.wire) == ("bf16", None, None)
        strategy.resolve_wire()  # at setup: the root device is MPS, so torch's hook casts on the device
        assert (strategy._ddp_comm_hook, strategy.wire.wire) == (default_hooks.bf16_compress_hook, None)
        assert strategy._timeout == timedelta(seconds=60)
        cli = LightningCLI(TinyModel, run=False, save_config_callback=None,
                           args=common + ["--trainer.strategy=mccl_fp16_compress"])
        assert type(cli.trainer.strategy) is MCCLStrategy and cli.trainer.strategy.compress == "fp16"
        assert cli.trainer.strategy.root_device == torch.device("mps", 0)


def test_setup_on_mps_binds_no_device_creates_no_cuda_stream_and_registers_the_hook(mps_stand_in, tmp_path):
    """Obstacles (b), (c), (d), (e) with a real mccl group of one rank; the module stays on the CPU (there
    is no MPS here), the strategy's root device is MPS."""
    import atexit

    from lightning_mccl.lightning import group

    from lightning.fabric.utilities.distributed import _InfiniteBarrier

    from fit_script import IN, TinyModel
    from lightning_mccl.lightning import MCCLStrategy

    mps_stand_in.setenv("MASTER_ADDR", "127.0.0.1")
    mps_stand_in.setenv("MASTER_PORT", str(free_port()))
    buckets = []

    def hook_spy(state, bucket):
        buckets.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    at_exit = []

    def unregister(handler):
        at_exit[:] = [h for h in at_exit if h is not handler]

    mps_stand_in.setattr(atexit, "register", at_exit.append)
    mps_stand_in.setattr(atexit, "unregister", unregister)
    init_calls = spy_init_process_group(mps_stand_in)
    forbid_cuda_stream(mps_stand_in)
    strategy = make_trainer(MCCLStrategy(ddp_comm_hook=hook_spy, timeout=60), "mps", tmp_path).strategy
    assert strategy.root_device == torch.device("mps", 0)
    try:
        strategy.setup_distributed()
        assert len(init_calls) == 1 and "device_id" not in init_calls[0], init_calls  # (b)
        assert init_calls[0]["timeout"] == timedelta(seconds=60)
        assert dist.get_backend() == "mccl" and dist.group.WORLD.bound_device_id is None
        assert at_exit == [group._destroy_default_group]  # (e)
        group.destroy_at_exit()
        assert at_exit == [group._destroy_default_group]  # once, however often asked
        with _InfiniteBarrier():  # Lightning's Gloo group next to ours: unbound, so Gloo can run it
            pass

        module = TinyModel()
        strategy.connect(module)
        strategy.configure_ddp()  # (c): no CUDA stream, no device_ids
        ddp = strategy.model
        assert isinstance(ddp, DistributedDataParallel) and ddp.device_ids is None
        assert [hook for hook, _ in ddp._comm_hooks] == [hook_spy]  # (d)
        x = torch.randn(4, IN)
        ddp(x).square().sum().backward()
        assert buckets, "the registered comm hook did not run"
        expected = torch.func.grad(lambda p: torch.func.functional_call(module, p, (x,)).square().sum())(
            {k: v.detach() for k, v in module.named_parameters()})
        for name, param in module.named_parameters():
            torch.testing.assert_close(param.grad, expected[name], atol=1e-6, rtol=1e-6)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_lightning_ddp_strategy_on_mps_shows_the_obstacles(monkeypatch, no_launch_env):
    """What MCCLStrategy overrides, as Lightning's DDPStrategy does it with an MPS root device: device_id is
    passed (b), [0] becomes device_ids and a CUDA stream is created (c), and no comm hook is registered (d)."""
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy

    from fit_script import TinyModel
    from lightning_mccl.lightning import MCCLStrategy

    mps = torch.device("mps", 0)

    class Stop(Exception):
        pass

    init_calls = spy_init_process_group(monkeypatch, stop=Stop)
    forbid_cuda_stream(monkeypatch)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))

    def strategy(cls):
        return cls(parallel_devices=[mps], cluster_environment=LightningEnvironment(), process_group_backend="mccl",
                   ddp_comm_hook=default_hooks.allreduce_hook)

    ddp_strategy, mccl_strategy = strategy(DDPStrategy), strategy(MCCLStrategy)
    for s in (ddp_strategy, mccl_strategy):
        with pytest.raises(Stop):
            s.setup_distributed()
    import lightning
    from packaging.version import Version

    binds = Version(lightning.__version__) >= Version("2.6")  # DDPStrategy passes device_id since Lightning 2.6
    assert init_calls[0].get("device_id") == (mps if binds else None) and "device_id" not in init_calls[1]

    assert ddp_strategy.determine_ddp_device_ids() == [0]
    with pytest.raises(AssertionError, match=r"torch\.cuda\.Stream\(\) was created"):
        ddp_strategy._setup_model(TinyModel())

    for s in (ddp_strategy, mccl_strategy):
        s.model = mock.create_autospec(DistributedDataParallel, instance=True)
        s._register_ddp_hooks()
    ddp_strategy.model.register_comm_hook.assert_not_called()
    mccl_strategy.model.register_comm_hook.assert_called_once_with(state=None, hook=default_hooks.allreduce_hook)


def test_the_diloco_fleet_config_instantiates_through_lightning_cli(mps_stand_in, tmp_path):
    """configs/vit_fleet24_diloco.yaml's trainer section (its strategy as LightningCLI builds it from YAML) on the
    MPS stand-in, with the tiny model of these tests instead of the recipe's ViT."""
    from pathlib import Path

    import yaml
    from lightning.pytorch.accelerators import MPSAccelerator
    from lightning.pytorch.cli import LightningCLI

    from fit_script import TinyModel
    from lightning_mccl.lightning import MCCLDiLoCoStrategy

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "vit_fleet24_diloco.yaml").read_text())
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump({"trainer": {**config["trainer"], "logger": False}}))
    with mock.patch.object(sys, "argv", ["train.py"]):
        cli = LightningCLI(TinyModel, run=False, save_config_callback=None,
                           args=[f"--config={path}", f"--trainer.default_root_dir={tmp_path}"])
    strategy = cli.trainer.strategy
    assert type(strategy) is MCCLDiLoCoStrategy and isinstance(cli.trainer.accelerator, MPSAccelerator)
    assert cli.trainer.num_nodes == 24
    assert (strategy.sync_every, strategy.sync_delay, strategy.fragments, strategy.outer_lr, strategy.outer_momentum,
            strategy.compress) == (3, 1, 3, 3.0, 0.0, "bf16")  # outer lr 3: a fine-tuning job (docs/diloco.md)
    strategy.resolve_wire()  # on MPS the pseudo-gradients are cast to bf16 on the device
    assert (strategy.wire.cast, strategy.wire.wire) == ("bf16", None) and strategy._timeout == timedelta(seconds=600)
