"""MCCLDiLoCoStrategy ("mccl_diloco"): its arguments and their errors without a fit; the Trainer settings it
refuses at setup, in a one-rank fit over a real mccl group; and a checkpoint of the first releases'
`MCCLStrategy(sync="diloco")` (fixtures/diloco_v0, made by commit e9c3829's tests/lightning/resume_script.py
--diloco: the end of epoch 1, step 10, mid-round with the sync of step 9 in flight) resumed on 2 ranks to the
end of the fit that made it."""
from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys

import pytest
import torch

from launch_env import HERE, clean_env
from lightning_mccl.launcher import free_port

FIXTURE = os.path.join(HERE, "fixtures", "diloco_v0")


def test_arguments_and_defaults():
    """compress is the pseudo-gradients' wire type (the default group stays uncompressed); the defaults (H = 4,
    plain averaging, tau = 1, fragments "auto", the other options for short jobs off) are declared once, in
    diloco/settings.py, and shown in both signatures."""
    from lightning_mccl import diloco, wire_policy
    from lightning_mccl.diloco import SYNC_EVERY, DiLoCo
    from lightning_mccl.lightning import MCCLDiLoCoStrategy

    s = MCCLDiLoCoStrategy(sync_every=4, compress="bf16", outer_lr=0.5, outer_momentum=0.8, sync_delay=4)
    assert (s.sync_every, s.outer_lr, s.outer_momentum, s.sync_delay, s.compress) == (4, 0.5, 0.8, 4, "bf16")
    s = MCCLDiLoCoStrategy(warm_start=32, fragments=4, qsr_alpha=2e-3, max_sync_every=16)
    assert (s.warm_start, s.fragments, s.qsr_alpha, s.max_sync_every) == (32, 4, 2e-3, 16)
    short = {"warm_start": diloco.WARM_START, "fragments": diloco.FRAGMENTS, "qsr_alpha": diloco.QSR_ALPHA,
             "max_sync_every": diloco.MAX_SYNC_EVERY}
    assert short == {"warm_start": 0, "fragments": "auto", "qsr_alpha": None, "max_sync_every": None}
    assert s.diloco is None and s.outer_group is None  # only during a fit
    assert s._ddp_kwargs == {}  # no DDP argument reaches DistributedDataParallel: the model is never wrapped
    cpu = wire_policy.resolve("bf16", "cpu", "mccl", "MCCLDiLoCoStrategy", diloco=True)
    mps = wire_policy.resolve("bf16", "mps", "mccl", "MCCLDiLoCoStrategy", diloco=True)
    int8 = wire_policy.resolve("int8", "cpu", "mccl", "MCCLDiLoCoStrategy", diloco=True)
    assert (cpu.wire, cpu.averaging, cpu.hook) == ("bf16", wire_policy.ALLREDUCE, None)  # the outer group narrows
    assert (mps.wire, mps.averaging, mps.cast) == (None, wire_policy.CAST_MEAN, "bf16")  # cast on the device
    assert (int8.wire, int8.averaging) == (None, wire_policy.INT8_MEAN)
    for fn in (MCCLDiLoCoStrategy.__init__, DiLoCo.__init__):
        params = inspect.signature(fn).parameters
        assert (params["outer_lr"].default, params["outer_momentum"].default, params["sync_delay"].default) \
            == (1.0, 0.0, 1), fn
        assert {name: params[name].default for name in short} == short, fn
    assert inspect.signature(MCCLDiLoCoStrategy.__init__).parameters["sync_every"].default == SYNC_EVERY == 3
    ddp_only = {"ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper", "bucket_cap_mb", "find_unused_parameters",
                "static_graph", "compress_options", "kwargs"}
    assert not ddp_only & set(inspect.signature(MCCLDiLoCoStrategy.__init__).parameters)


@pytest.mark.parametrize("kwargs,message", [
    (dict(sync_every=0), "MCCLDiLoCoStrategy(sync_every=0): expected the inner steps per round, an int >= 1"),
    (dict(sync_every=4, sync_delay=5), "MCCLDiLoCoStrategy(sync_delay=5): expected an int from 1 to sync_every=4"),
    (dict(outer_momentum=1.5), "MCCLDiLoCoStrategy(outer_momentum=1.5): expected a number in [0, 1)"),
    (dict(warm_start=-1), "MCCLDiLoCoStrategy(warm_start=-1): expected the synchronous inner steps at the start"),
    (dict(fragments=0), "MCCLDiLoCoStrategy(fragments=0): expected the number of parts the parameters sync in"),
    (dict(fragments="Auto"), "MCCLDiLoCoStrategy(fragments='Auto'): expected the number of parts the parameters "
                             "sync in, an int >= 1, or 'auto'"),
    (dict(fragments=1.5), "MCCLDiLoCoStrategy(fragments=1.5): expected the number of parts the parameters sync in"),
    (dict(fragments=True), "MCCLDiLoCoStrategy(fragments=True): expected the number of parts the parameters sync"),
    (dict(qsr_alpha=1e-3), "MCCLDiLoCoStrategy(qsr_alpha=0.001): the H schedule needs a cap, max_sync_every"),
    (dict(qsr_alpha=1e-3, max_sync_every=2), "MCCLDiLoCoStrategy(max_sync_every=2): expected an int >= "
                                             "sync_every=3"),
    (dict(compress="powersgd"), "MCCLDiLoCoStrategy(compress='powersgd'): DiLoCo's pseudo-gradients travel as "
                                "compress='bf16' or 'fp16' or 'int8' or float32"),
    (dict(compress="bf16_hook"), "MCCLDiLoCoStrategy(compress='bf16_hook'): DiLoCo's pseudo-gradients travel as"),
    (dict(compress="int4"), "MCCLDiLoCoStrategy(compress='int4'): expected one of"),
    (dict(options={"MCCL_WIRE_DTYPE": "bf16"}), "MCCLDiLoCoStrategy(options=...): MCCL_WIRE_DTYPE is chosen by"),
])
def test_bad_arguments_are_named(kwargs, message):
    from lightning_mccl.lightning import MCCLDiLoCoStrategy

    with pytest.raises(ValueError) as info:
        MCCLDiLoCoStrategy(**kwargs)
    assert str(info.value).startswith(message), str(info.value)


def test_the_fits_mode_names_the_fragments_auto_resolved_to():
    """comm_mode() (the end-of-fit summary's line and the accuracy costs' key) names the fit's DiLoCo object's
    number of fragments: "auto" at H = 4 on a model of 10 parameter tensors is 4, the setting the record
    measured; fragments=1 the whole model's."""
    import types

    from lightning_mccl.accuracy_costs import costs
    from lightning_mccl.diloco import DiLoCo
    from lightning_mccl.lightning import MCCLDiLoCoStrategy

    model = torch.nn.Sequential(*(torch.nn.Linear(2, 2) for _ in range(5)))
    modes = []
    for fragments in ("auto", 1):
        s = MCCLDiLoCoStrategy(sync_every=4, fragments=fragments)
        s._outer = types.SimpleNamespace(diloco=DiLoCo(model, 4, fragments=fragments))  # as during a fit
        modes.append(s.comm_mode())
    assert [m.fragments for m in modes] == [4, 1]
    assert "H = 4, tau = 1, 4 fragments, plain averaging" in modes[0].describe()
    assert [c.points for c in costs(modes[0])] == [-11.34]
    assert "fragments" not in modes[1].describe() and costs(modes[1])[0].points == -12.36


def test_a_ddp_argument_is_refused_by_the_signature():
    from lightning_mccl.lightning import MCCLDiLoCoStrategy

    with pytest.raises(TypeError, match="unexpected keyword argument 'bucket_cap_mb'"):
        MCCLDiLoCoStrategy(bucket_cap_mb=25)


@pytest.mark.parametrize("trainer_kwargs,message", [
    (dict(sync_batchnorm=True), "MCCLDiLoCoStrategy with Trainer(sync_batchnorm=True): that synchronises every "
                                "forward pass"),
    (dict(model="two_optimizers"), "MCCLDiLoCoStrategy counts a round in the steps of one optimizer; this "
                                   "LightningModule has 2"),
    (dict(precision="16-mixed"), "MCCLDiLoCoStrategy with a gradient scaler (precision='16-mixed')"),
    (dict(strategy_kwargs=dict(compress="int8"), backend="gloo"),
     "MCCLDiLoCoStrategy(compress='int8') needs process_group_backend='mccl'"),
])
def test_trainer_settings_that_do_not_fit_are_named_at_setup(no_launch_env, tmp_path, trainer_kwargs, message):
    """A one-rank fit over a real group: the Trainer's setting is refused when the strategy sets up, before any
    step."""
    import lightning as L

    from fit_script import TinyModel
    from lightning_mccl.lightning import MCCLDiLoCoStrategy

    class TwoOptimizers(TinyModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def configure_optimizers(self):
            return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters(), lr=0.1)]

    model = TwoOptimizers() if trainer_kwargs.pop("model", None) else TinyModel()
    no_launch_env.setenv("MASTER_PORT", str(free_port()))
    strategy = MCCLDiLoCoStrategy(sync_every=4, timeout=30, process_group_backend=trainer_kwargs.pop("backend", "mccl"),
                                  **trainer_kwargs.pop("strategy_kwargs", {}))
    if trainer_kwargs.get("precision") == "16-mixed":  # a CPU has no float16 scaler of its own: Lightning's plugin
        from lightning.pytorch.plugins.precision import MixedPrecision

        trainer_kwargs = {"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))]}
    trainer = L.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), **trainer_kwargs)
    try:
        with pytest.raises(ValueError) as info:
            trainer.fit(model)
        assert str(info.value).startswith(message), str(info.value)
        assert trainer.global_step == 0
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_a_checkpoint_of_the_first_diloco_strategy_resumes_to_its_fit(tmp_path):
    """fixtures/diloco_v0 holds rank 0's checkpoint and rank 1's part, and both ranks' final parameters of the fit
    that made them (3 epochs of 5 steps). Resumed by MCCLDiLoCoStrategy on 2 ranks, with the default
    fragments="auto" (it takes the checkpoint's one fragment, the whole model, where a new fit of this model would
    sync 3), the fit takes the remaining 5 steps, and ends with the same parameters as that fit: bit for bit on
    both ranks where the outer step's arithmetic is the same (plain averaging, as here), and both ranks holding
    the anchor."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(os.path.join(FIXTURE, "step10.ckpt"), ckpt / "last.ckpt")
    shutil.copy(os.path.join(FIXTURE, "step10.ckpt.rank1"), ckpt / "last.ckpt.rank1")
    cmd = [sys.executable, "-m", "lightning_mccl.cli", "launch", "--local", "1", "--nproc-per-node", "2", "--",
           sys.executable, os.path.join(HERE, "resume_script.py"), str(tmp_path), "--diloco-auto"]
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    attempts = (tmp_path / "attempts.rank0.txt").read_text()
    assert attempts == "attempt 0 started at global step 10\n", attempts
    expected = torch.load(os.path.join(FIXTURE, "final_params.pt"))
    saved = [torch.load(tmp_path / f"final.rank{r}.pt") for r in (0, 1)]
    assert [s["global_step"] for s in saved] == [15, 15]
    finals = [s["params"] for s in saved]
    for rank, final in enumerate(finals):
        for name, value in expected[rank].items():
            assert torch.equal(final[name], value), (rank, name, (final[name] - value).abs().max())
    for name in finals[0]:
        assert torch.equal(finals[0][name], finals[1][name]), name
