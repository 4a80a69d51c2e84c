"""A Lightning fit over mccl whose rank 1 is SIGKILLed mid-epoch, relaunched by `mccl launch --max-restarts 1`
and resumed from its last checkpoint, ends with exactly the weights (and momentum) of an uninterrupted run.

Both runs (resume_script.py under `mccl launch --local 1 --nproc-per-node 2`) start together, under one
hard deadline."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from launch_env import HERE, clean_env

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)

SCRIPT = os.path.join(HERE, "resume_script.py")
DEADLINE_S = 180  # both launches together; about 25 s on 2 idle cores
KILL_AT = 7  # global step: epoch 1, batch 2 of 5 (the last checkpoint is the end of epoch 0, step 5)


def _launch(out_dir, *extra, max_restarts=0):
    cmd = [sys.executable, "-m", "lightning_mccl.cli", "launch", "--local", "1", "--nproc-per-node", "2",
           "--max-restarts", str(max_restarts), "--grace", "5", "--", sys.executable, SCRIPT, str(out_dir), *extra]
    log = open(os.path.join(out_dir, "launch.log"), "w")
    return subprocess.Popen(cmd, env=clean_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log


def _wait_all(procs: dict) -> dict:
    deadline = time.monotonic() + DEADLINE_S
    codes = {}
    try:
        for name, (proc, log) in procs.items():
            try:
                codes[name] = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = "timed out"
    finally:
        for proc, log in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    return codes


def test_a_fit_killed_mid_epoch_and_relaunched_resumes_to_the_same_weights(tmp_path):
    ref_dir, kill_dir = tmp_path / "uninterrupted", tmp_path / "killed"
    ref_dir.mkdir()
    kill_dir.mkdir()
    codes = _wait_all({"uninterrupted": _launch(ref_dir), "killed": _launch(kill_dir, str(KILL_AT), max_restarts=1)})
    logs = {name: (d / "launch.log").read_text() for name, d in (("uninterrupted", ref_dir), ("killed", kill_dir))}
    assert codes == {"uninterrupted": 0, "killed": 0}, f"{codes}\n" + "\n".join(
        f"--- {n}:\n{text[-3000:]}" for n, text in logs.items())

    # the killed job: rank 1 died by SIGKILL, the launcher restarted both ranks, which resumed at step 5
    assert "rank 1 on local failed with exit code 137: restarting all 2 ranks (restart 1 of 1" in logs["killed"]
    for rank in (0, 1):
        started = (kill_dir / f"attempts.rank{rank}.txt").read_text().splitlines()
        assert started == ["attempt 0 started at global step 0", "attempt 1 started at global step 5"], started
        assert (ref_dir / f"attempts.rank{rank}.txt").read_text().splitlines() == [
            "attempt 0 started at global step 0"]

    for rank in (0, 1):
        ref = torch.load(ref_dir / f"final.rank{rank}.pt")
        got = torch.load(kill_dir / f"final.rank{rank}.pt")
        assert ref["global_step"] == got["global_step"] == 15
        assert all((ref["params"][k] - v).abs().max() > 1e-3 for k, v in ref["initial"].items()), "nothing trained"
        for name in ref["params"]:
            diff = (got["params"][name] - ref["params"][name]).abs().max().item()
            assert diff == 0.0, f"rank {rank} {name}: resumed weights differ from the uninterrupted run by {diff}"
        for a, b in zip(got["momentum"], ref["momentum"]):
            assert torch.equal(a, b), "SGD momentum differs after the resume"
    # and the two ranks agree (DDP kept them in sync through mccl)
    r0, r1 = torch.load(kill_dir / "final.rank0.pt"), torch.load(kill_dir / "final.rank1.pt")
    assert all(torch.equal(r0["params"][k], r1["params"][k]) for k in r0["params"])
