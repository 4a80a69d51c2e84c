"""A Lightning fit over mccl whose rank 1 is SIGKILLed mid-epoch, relaunched by `mccl launch --max-restarts 1`
and resumed from its last checkpoint, ends with exactly the weights (and momentum) of an uninterrupted run;
the same for `MCCLStrategy(sync="diloco")` killed mid-round with an outer sync in flight at its last
checkpoint (its uninterrupted reference runs first in the same processes), where the fit also shows DiLoCo at
work: no allreduce on the default group in any training step, one outer allreduce per round in bf16, the
anchor the same on both ranks after every step and moved only when an outer step is applied; and the same with
DiLoCo's options for short jobs (a warm start, the H schedule, 2 fragments), killed with a fragment in flight.

The four launches (resume_script.py under `mccl launch --local 1 --nproc-per-node 2`) start together, under
one hard deadline."""
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
DEADLINE_S = 300  # the four launches together; about 25 s on 2 idle cores for the first two alone
KILL_AT = 7  # global step: epoch 1, batch 2 of 5 (the last checkpoint is the end of epoch 0, step 5)
# DiLoCo (sync_every=3, sync_delay=2): the last checkpoint is the end of epoch 1, step 10, with the sync that
# started at step 9 in flight (applied at 11)
DILOCO_KILL_AT = 12


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


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    dirs = {name: root / name for name in ("uninterrupted", "killed", "diloco", "diloco_short")}
    for d in dirs.values():
        d.mkdir()
    codes = _wait_all({"uninterrupted": _launch(dirs["uninterrupted"]),
                       "killed": _launch(dirs["killed"], str(KILL_AT), max_restarts=1),
                       "diloco": _launch(dirs["diloco"], str(DILOCO_KILL_AT), "--diloco", max_restarts=1),
                       "diloco_short": _launch(dirs["diloco_short"], str(DILOCO_KILL_AT), "--diloco-short",
                                               max_restarts=1)})
    logs = {name: (d / "launch.log").read_text() for name, d in dirs.items()}
    assert codes == dict.fromkeys(dirs, 0), f"{codes}\n" + "\n".join(
        f"--- {n}:\n{text[-3000:]}" for n, text in logs.items())
    return dirs, logs


def test_a_fit_killed_mid_epoch_and_relaunched_resumes_to_the_same_weights(runs):
    dirs, logs = runs
    ref_dir, kill_dir = dirs["uninterrupted"], dirs["killed"]

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


def _steps(path):
    """resume_script's DiLoCo record: {global step: (default-group allreduces, outer allreduces, anchor crc, wire)}."""
    rows = [line.split() for line in path.read_text().splitlines()]
    return {int(r[0]): (int(r[1]), int(r[2]), int(r[3]), r[4]) for r in rows}


def _resumed_as_uninterrupted(name, dirs, logs):
    """A DiLoCo run killed at step 12 and resumed from step 10 ended as its uninterrupted reference, weights and
    inner momentum bit for bit, with both ranks holding the same weights; returns the reference's two records."""
    run, ref = dirs[name], dirs[name] / "reference"
    assert "rank 1 on local failed with exit code 137: restarting all 2 ranks (restart 1 of 1" in logs[name]
    for rank in (0, 1):
        assert (run / f"attempts.rank{rank}.txt").read_text().splitlines() == [
            "attempt 0 started at global step 0", "attempt 1 started at global step 10"]
        got, want = torch.load(run / f"final.rank{rank}.pt"), torch.load(ref / f"final.rank{rank}.pt")
        assert got["global_step"] == want["global_step"] == 15
        assert all((want["params"][k] - v).abs().max() > 1e-3 for k, v in want["initial"].items()), "nothing trained"
        for key, value in want["params"].items():
            diff = (got["params"][key] - value).abs().max().item()
            assert diff == 0.0, f"rank {rank} {key}: the resumed DiLoCo fit differs from the uninterrupted one: {diff}"
        for a, b in zip(got["momentum"], want["momentum"]):
            assert torch.equal(a, b), "the inner SGD momentum differs after the resume"
    r0, r1 = torch.load(ref / "final.rank0.pt"), torch.load(ref / "final.rank1.pt")
    assert all(torch.equal(r0["params"][k], r1["params"][k]) for k in r0["params"]), "the ranks end apart"
    return r0, r1


def test_a_diloco_fit_killed_mid_round_and_relaunched_resumes_to_the_same_weights(runs):
    dirs, logs = runs
    run, ref = dirs["diloco"], dirs["diloco"] / "reference"
    r0, r1 = _resumed_as_uninterrupted("diloco", dirs, logs)
    for record in (r0, r1):  # CommMetrics watched the outer group (bf16; the default group reads off)
        assert record["comm_wire"] == "bf16" and len(record["comm_bytes_per_step"]) == 3, record
        assert all(b > 0 for b in record["comm_bytes_per_step"]), record["comm_bytes_per_step"]

    steps = [_steps(ref / f"steps.rank{rank}.txt") for rank in (0, 1)]
    assert sorted(steps[0]) == sorted(steps[1]) == list(range(1, 16))
    rows = steps[0]
    for rank in (0, 1):
        for s, (default, outer, anchor, wire) in steps[rank].items():
            assert anchor == rows[s][2], f"rank {rank}'s anchor after step {s} differs from rank 0's"
            assert default == 0, f"training step {s} ran an allreduce on the default group (rank {rank})"
            assert wire == "bf16"
            # one outer allreduce at the end of every round of 3 steps; counted by the engine's thread, so
            # one still in flight may or may not be counted yet; none is between its apply and the next start
            started = s // 3
            assert started - 1 <= outer <= started, (rank, s, outer)
        assert [steps[rank][s][1] for s in (1, 2, 5, 8, 11, 14)] == [0, 0, 1, 2, 3, 4]
    moved = [s for s in range(2, 16) if rows[s][2] != rows[s - 1][2]]  # the anchor moves 2 steps after a start
    assert moved == [5, 8, 11, 14], moved
    resumed = _steps(run / "steps.rank1.txt")  # the second attempt's (its outer group counts from 0)
    assert sorted(resumed) == list(range(11, 16))
    assert {s: (r[0], r[2], r[3]) for s, r in resumed.items()} == {s: (rows[s][0], rows[s][2], rows[s][3])
                                                                  for s in resumed}


def test_a_diloco_fit_with_the_options_for_short_jobs_killed_with_a_fragment_in_flight_resumes_exactly(runs):
    """resume_script --diloco-short (a warm start of 3 steps, the H schedule's rounds of 2 then 4 steps as the
    learning rate falls, 2 fragments, tau = 2): the checkpoint at step 10 holds the second fragment's sync of step
    9 in flight and the current round's H, and the fit resumed from it ends with the uninterrupted fit's weights."""
    dirs, logs = runs
    run, ref = dirs["diloco_short"], dirs["diloco_short"] / "reference"
    _resumed_as_uninterrupted("diloco_short", dirs, logs)
    state = torch.load(run / "ckpt" / "epoch=1.ckpt", weights_only=False)["diloco"]
    assert (state["warm_start"], state["fragments"], state["max_sync_every"]) == (3, 2, 4)
    schedule = state["schedule"]
    assert (schedule["round_start"], schedule["length"]) == (9, 4), schedule
    assert schedule["pending"][0] is None and schedule["pending"][1][:2] == [9, 11], schedule
    steps = [_steps(ref / f"steps.rank{rank}.txt") for rank in (0, 1)]
    rows = steps[0]
    for rank in (0, 1):
        for s, (default, _, anchor, _) in steps[rank].items():
            assert anchor == rows[s][2] and default == 0, (rank, s)
    # each warm step's outer step at once; then each fragment's 2 steps after its start: the first round's (H = 2)
    # at 4 and 5, the next ones' (H = 4: the learning rate fell) at 7, 9 and 11, 13, and fragment 0's at 15
    moved = [s for s in range(2, 16) if rows[s][2] != rows[s - 1][2]]
    assert moved == [2, 3, 6, 7, 9, 11, 13, 15], moved
