"""The recipe resumes after a crash as a user meets it: `mccl launch --local 2 --max-restarts 1 -- python
examples/vit_finetune.py fit --config configs/vit_local.yaml` (tiny: 1 block, 3 batches an epoch, 3 epochs), rank 1
SIGKILLed as epoch 2 starts (recipe_kill.py). The restarted fit finds the job's checkpoint (the config's fixed
folder, not the new run's version_N) with nothing added to the command, trains the one epoch left, and ends with
the weights and optimizer state of the same job interrupted the same way and resumed by hand (`--ckpt_path last`).

The restarted job and the interrupted one start together, then the hand-resumed one; one hard deadline."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_vit_recipe import LAUNCH_VARS, LOCAL, SCRIPT, load_ckpt

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)

HERE = Path(__file__).resolve().parent
EPOCHS, KILLED_AT, BATCHES = 3, 2, 3
DEADLINE_S = 420  # all three jobs: about 80 s on 2 busy cores for the restarted one alone


def _start(cwd: Path, *extra: str, max_restarts: int):
    kill = f'{{"class_path": "recipe_kill.KillRank", "init_args": {{"out_dir": "{cwd}", "epoch": {KILLED_AT}}}}}'
    cmd = [sys.executable, "-m", "lightning_mccl.cli", "launch", "--local", "2", "--max-restarts", str(max_restarts),
           "--", sys.executable, str(SCRIPT), "fit", "--config", str(LOCAL), "--trainer.max_epochs", str(EPOCHS),
           "--trainer.limit_train_batches", str(BATCHES), "--trainer.limit_val_batches", "1",
           "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
           "--model.model_kwargs", "{depth: 1}", f"--trainer.callbacks+={kill}", *extra]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])), OMP_NUM_THREADS="1")
    log = open(cwd / "launch.log", "a")
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log


def _wait(job, deadline: float):
    proc, log = job
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return "timed out"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    restarted, by_hand = (tmp_path_factory.mktemp(name) for name in ("restarted", "by_hand"))
    deadline = time.monotonic() + DEADLINE_S
    first = _start(restarted, max_restarts=1), _start(by_hand, max_restarts=0)
    codes = [_wait(first[1], deadline)]
    if codes[0] != "timed out":
        codes.append(_wait(_start(by_hand, "--ckpt_path", "last", max_restarts=0), deadline))
    codes.insert(0, _wait(first[0], deadline))
    logs = {d.name: (d / "launch.log").read_text(errors="replace") for d in (restarted, by_hand)}
    assert codes == [0, 137, 0], f"{codes}\n" + "\n".join(f"--- {n}:\n{t[-4000:]}" for n, t in logs.items())
    return restarted, by_hand, logs


def _attempts(folder: Path, rank: int) -> list:
    return (folder / f"attempts.rank{rank}.txt").read_text().splitlines()


def test_a_restarted_fit_resumes_from_the_jobs_checkpoint_by_itself(jobs):
    restarted, _, logs = jobs
    log = logs[restarted.name]
    assert "rank 1 on local failed with exit code 137: restarting all 2 ranks (restart 1 of 1" in log
    resumed_at = f"epoch {KILLED_AT}, step {KILLED_AT * BATCHES}"
    for rank in (0, 1):  # one epoch of three trained after the restart
        assert _attempts(restarted, rank) == ["attempt 0 started at epoch 0, step 0",
                                              f"attempt 1 started at {resumed_at}"]
    # the restart is a new run of the job (version_1); its checkpoint came from the job's own folder
    assert sorted(p.name for p in (restarted / "runs" / "vit_local").iterdir()) == ["checkpoints", "version_0",
                                                                                    "version_1"]
    assert f"Restoring states from the checkpoint path at {restarted}/runs/vit_local/checkpoints/last.ckpt" in log
    assert "final val/acc" in log and f"after {EPOCHS} epochs on 2 rank(s)" in log
    assert "mccl: all 2 ranks finished (after 1 restart)" in log


def test_it_ends_with_the_weights_of_the_job_resumed_by_hand(jobs):
    restarted, by_hand, logs = jobs
    assert "failed: rank 1 on local exited with code 137" in logs[by_hand.name]
    for rank in (0, 1):
        assert _attempts(by_hand, rank) == ["attempt 0 started at epoch 0, step 0",
                                            f"attempt 0 started at epoch {KILLED_AT}, step {KILLED_AT * BATCHES}"]
    got, want = (load_ckpt(d / "runs" / "vit_local" / "checkpoints" / "last.ckpt") for d in (restarted, by_hand))
    assert got["epoch"] == want["epoch"] == EPOCHS - 1 and got["global_step"] == want["global_step"] == EPOCHS * BATCHES
    assert got["state_dict"].keys() == want["state_dict"].keys()
    for name, value in want["state_dict"].items():
        assert torch.equal(got["state_dict"][name], value), f"{name}: the restarted fit's weights differ"
    mine, theirs = got["optimizer_states"][0]["state"], want["optimizer_states"][0]["state"]
    assert mine.keys() == theirs.keys() and len(mine) > 0
    for i in theirs:
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(mine[i][key], theirs[i][key]), (i, key)
