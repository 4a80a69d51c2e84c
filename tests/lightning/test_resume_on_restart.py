"""lightning_mccl.lightning.resume: which attempt a process is, the ckpt_path a fit gets on a restart, and every
rank resuming from the same checkpoint (2 ranks over mccl: a rank that found none fails the fit on every rank,
naming the ranks, before anything trains)."""
from __future__ import annotations

import pytest

from lightning_mccl.lightning import ckpt_path_on_restart
from lightning_mccl.lightning.resume import check_same_checkpoint, restart_count
from lightning_mccl.testing import run_ranks


@pytest.mark.parametrize("environ, count", [
    ({}, 0), ({"MCCL_RESTART_COUNT": "0"}, 0), ({"MCCL_RESTART_COUNT": "2"}, 2),
    ({"TORCHELASTIC_RESTART_COUNT": "1"}, 1), ({"MCCL_RESTART_COUNT": ""}, 0)])
def test_the_restart_count_is_the_launchers(environ, count):
    assert restart_count(environ) == count


def test_a_restart_resumes_from_last_unless_a_checkpoint_is_given():
    assert ckpt_path_on_restart(environ={}) is None
    assert ckpt_path_on_restart(environ={"MCCL_RESTART_COUNT": "0"}) is None
    assert ckpt_path_on_restart(environ={"MCCL_RESTART_COUNT": "1"}) == "last"
    assert ckpt_path_on_restart(environ={"TORCHELASTIC_RESTART_COUNT": "3"}) == "last"
    assert ckpt_path_on_restart("epoch=3.ckpt", environ={"MCCL_RESTART_COUNT": "1"}) == "epoch=3.ckpt"


def same_checkpoint_worker(rank, world_size, paths):
    try:
        check_same_checkpoint("MCCLStrategy", paths[rank])
    except RuntimeError as e:
        return str(e)
    return None


@pytest.mark.slow  # three groups of 2-3 ranks: about 13 s on 2 cores
def test_ranks_that_resume_from_different_checkpoints_fail_together_naming_them():
    run = run_ranks(same_checkpoint_worker, 3, backend="mccl", timeout=120,
                    args=(["/a/ckpt/last.ckpt", None, "/other/disk/last.ckpt"],))
    assert run[0] == run[1] == run[2] and run[0].startswith(
        "MCCLStrategy: the ranks resume from different checkpoints (ranks 0, 2: last.ckpt; rank 1: no checkpoint). "
        "Every rank loads the checkpoint from its own disk")
    assert "on a fleet, keep the checkpoints in a folder every Mac sees at the same path" in run[0]
    assert run_ranks(same_checkpoint_worker, 2, backend="mccl", timeout=120, args=([None, None],)) == [None, None]
    assert run_ranks(same_checkpoint_worker, 2, backend="mccl", timeout=120,
                     args=(["/a/last.ckpt", "/a/last.ckpt"],)) == [None, None]
