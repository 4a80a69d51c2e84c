"""MCCLElasticStrategy ("mccl_elastic") and MCCLElasticDiLoCoStrategy ("mccl_elastic_diloco") in this process:
their arguments and errors, the fits they refuse (each naming the setting), and a one-member fit over a real
elastic group: every sample trained once per epoch, Lightning's counters, the checkpoint's sampler state, a
resume from it, and the refusals of checkpoints that cannot resume (another strategy's, or mid-round).

The multi-process behaviour (kill, join, leave, pace, host 0 lost; DDP and DiLoCo) is tests/elastic/
test_lightning.py's, under `mccl launch --local 4 --elastic`."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_mccl.elastic import ElasticSettings
from lightning_mccl.launcher import free_port

NUM, GLOBAL = 24, 4
SETTINGS = ElasticSettings(timeout=20.0)


class Samples(Dataset):
    def __len__(self):
        return NUM

    def __getitem__(self, i):
        return torch.full((3,), float(i)), torch.tensor(float(i % 5)), i


class Stream(IterableDataset):
    def __iter__(self):
        return iter(Samples()[i] for i in range(NUM))


class Model(pl.LightningModule):
    def __init__(self, data=None, manual=False):
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.data = data if data is not None else Samples()
        self.automatic_optimization = not manual
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, y, ids = batch
        self.seen.append(ids.tolist())
        return ((self.net(x).squeeze(1) - y) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=GLOBAL)


@pytest.fixture
def one_member(no_launch_env):
    """The variables `mccl launch --elastic` gives a job of one member."""
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                        "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MCCL_ELASTIC": "1"}.items():
        no_launch_env.setenv(name, value)
    return no_launch_env


def trainer(tmp_path, strategy, **kwargs):
    return pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path),
                      **{"enable_checkpointing": False, "max_epochs": 2, **kwargs})


@pytest.mark.parametrize("kwargs, message", [
    ({"compress": "bf16"}, "MCCLElasticStrategy(compress=...): not taken under elastic training"),
    ({"ddp_comm_hook": lambda *a: None}, "MCCLElasticStrategy(ddp_comm_hook=...): not taken"),
    ({"global_batch": 0}, "MCCLElasticStrategy(global_batch=0): expected a positive integer"),
    ({"global_batch": 2.5}, "MCCLElasticStrategy(global_batch=2.5): expected a positive integer"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, message):
    from lightning_mccl.lightning import MCCLElasticStrategy

    with pytest.raises(ValueError) as info:
        MCCLElasticStrategy(**kwargs)
    assert str(info.value).startswith(message), str(info.value)


def test_diloco_arguments_are_checked_as_diloco_checks_them():
    from lightning_mccl.lightning import ElasticEnvironment, MCCLElasticDiLoCoStrategy

    with pytest.raises(ValueError, match=r"MCCLElasticDiLoCoStrategy\(sync_every=0\): expected the inner steps"):
        MCCLElasticDiLoCoStrategy(sync_every=0)
    with pytest.raises(ValueError, match=r"MCCLElasticDiLoCoStrategy\(outer_momentum=1\)"):
        MCCLElasticDiLoCoStrategy(outer_momentum=1)
    s = MCCLElasticDiLoCoStrategy(sync_every=3, outer_lr=0.7)
    assert (s.sync_every, s.outer_lr, s.outer_momentum) == (3, 0.7, 0.0)
    assert isinstance(s.cluster_environment, ElasticEnvironment) and s.manager is None and s.diloco is None


@pytest.mark.parametrize("model, kwargs, message", [
    ("stream", {}, "MCCLElasticStrategy: the training DataLoader's dataset is an IterableDataset (Stream)"),
    ("manual", {}, "MCCLElasticStrategy cannot train with manual optimization"),
    ("plain", {"accumulate_grad_batches": 2}, "MCCLElasticStrategy cannot train with accumulate_grad_batches=2"),
    ("plain", {"limit_train_batches": 3}, "MCCLElasticStrategy cannot train with limit_train_batches=3"),
])
def test_fits_it_cannot_run_are_refused_naming_the_setting(one_member, tmp_path, model, kwargs, message):
    from lightning_mccl.lightning import MCCLElasticStrategy

    module = {"stream": lambda: Model(Stream()), "manual": lambda: Model(manual=True), "plain": Model}[model]()
    t = trainer(tmp_path, MCCLElasticStrategy(settings=SETTINGS), **kwargs)
    with pytest.raises(ValueError) as info:
        t.fit(module)
    assert str(info.value).startswith(message), str(info.value)


def test_one_member_fits_every_sample_once_and_its_checkpoint_resumes(one_member, tmp_path):
    from lightning_mccl.lightning import MCCLElasticStrategy

    folder = tmp_path / "ckpt"
    strategy = MCCLElasticStrategy(settings=SETTINGS, seed=3)
    model = Model()
    t = trainer(tmp_path, strategy, enable_checkpointing=True,
                callbacks=[ModelCheckpoint(dirpath=folder, save_last=True, every_n_epochs=1)])
    t.fit(model)
    per_epoch = NUM // GLOBAL
    assert (t.global_step, t.current_epoch, t.world_size, t.global_rank) == (2 * per_epoch, 2, 1, 0)
    for epoch in range(2):
        ids = np.concatenate(model.seen[epoch * per_epoch:(epoch + 1) * per_epoch])
        assert sorted(ids) == list(range(NUM)), f"epoch {epoch}: every sample once"
    assert model.seen[:per_epoch] != model.seen[per_epoch:], "each epoch in its own order"
    checkpoint = torch.load(folder / "last.ckpt", weights_only=True)
    assert checkpoint["mccl_elastic"]["step"] == 2 * per_epoch
    assert checkpoint["mccl_elastic"]["sampler"]["epoch"] == 1

    one_member.setenv("MASTER_PORT", str(free_port()))
    again, resumed = Model(), MCCLElasticStrategy(settings=SETTINGS, seed=3)
    trainer(tmp_path, resumed, max_epochs=3).fit(again, ckpt_path=str(folder / "last.ckpt"))
    assert resumed.manager.step == 3 * per_epoch and sorted(np.concatenate(again.seen)) == list(range(NUM))


def test_a_checkpoint_of_another_strategy_is_refused_naming_it(one_member, tmp_path):
    from lightning_mccl.lightning import MCCLElasticStrategy

    path = tmp_path / "plain.ckpt"
    plain = trainer(tmp_path, "auto", max_epochs=1)
    plain.fit(Model())
    plain.save_checkpoint(path)
    with pytest.raises(ValueError) as info:
        trainer(tmp_path, MCCLElasticStrategy(settings=SETTINGS)).fit(Model(), ckpt_path=str(path))
    assert f"MCCLElasticStrategy: the checkpoint {path} has no 'mccl_elastic' state" in str(info.value)


def test_elastic_diloco_refuses_a_checkpoint_in_the_middle_of_a_round(one_member, tmp_path):
    from lightning_mccl.lightning import MCCLElasticDiLoCoStrategy

    strategy = MCCLElasticDiLoCoStrategy(sync_every=2, settings=SETTINGS)
    t = trainer(tmp_path, strategy, enable_checkpointing=True,
                callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1)])
    with pytest.raises(ValueError) as info:
        t.fit(Model())
    assert str(info.value).startswith("MCCLElasticDiLoCoStrategy: a checkpoint was asked for in the middle of a round "
                                      "(after global step 1)"), str(info.value)
