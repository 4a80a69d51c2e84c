"""A Lightning fit with strategy="mccl_elastic" (DDP) or "mccl_elastic_diloco" under `mccl launch --local 4
--elastic` (lightning_rank.py: elastic_rank.py's linear regression in a LightningModule, 3 epochs of 12 batches
of 8 samples).

- One job goes through a member killed with SIGKILL mid-step (epoch 0), a member at half speed, and a rank that
  `mccl join` starts and the others admit at epoch 2: the others finish `fit`, every epoch's ledger holds every
  sample once, the members (the joiner too) end with identical weights and momentum equal to a float64 replay of
  the committed steps, Lightning's counters (global_step, current_epoch) are the job's on every member,
  `trainer.world_size` follows the membership (4, 3, 4) and host 0 stays rank 0; the slow member's share falls.
- The same under elastic DiLoCo (H = 2, a round of 2 batches per elastic step; plain SGD inside, plain averaging
  outside), with also a member asked to leave by `mccl leave` in epoch 1: the slow member's share of a round
  falls, and the members' weights equal a float64 replay of every committed round from the sample ids each
  member trained in it (the killed and the leaving members' rounds too), inner steps and the outer step weighted
  by samples. The launcher's lines: the killed rank's exit code, the joiner's start, the last line's changes.
- Another: a member asked to leave by `mccl leave` (it exits 0), then host 0 killed at epoch 1 (the others end
  with the documented sentence), and the checkpoint host 0 wrote at epoch 0's end resumed by 2 members, which
  finish the job's remaining epochs with every sample once.
"""
from __future__ import annotations

import csv
import itertools
import json
import os
import signal

import numpy as np
import pytest

from cli_runner import run_mccl
from elastic_job import LIGHTNING_RANK, ElasticJob, elastic_job, join_local, needs_proc  # noqa: F401 (fixture)
from elastic_rank import EPOCHS, GLOBAL_BATCH, LR, NUM_SAMPLES, dataset
from lightning_mccl.elastic import HOST_ZERO_MUST_STAY
from test_churn import replay

pytestmark = [pytest.mark.slow, needs_proc]
PER_EPOCH = -(-NUM_SAMPLES // GLOBAL_BATCH)
STEPS = EPOCHS * PER_EPOCH
KILL_AT, SLOW_FROM, JOIN_AT = 5, 3, 2 * PER_EPOCH


def commits(ledgers: dict) -> list:
    """(step, epoch, ids) of every committed step, from the epochs' ledgers (id -> the step that trained it)."""
    found = []
    for epoch, ledger in ledgers.items():
        ledger = np.array(ledger)
        assert (ledger >= 0).all(), f"epoch {epoch}: ids {np.flatnonzero(ledger < 0)} were never trained"
        found += [(int(s), int(epoch), np.flatnonzero(ledger == s).tolist()) for s in np.unique(ledger)]
    return sorted(found)


def check_members(job, members, epochs=range(EPOCHS), per_step=1) -> dict:
    """The members' results agree with each other and with the job: weights, momentum, ledgers, counters (the
    elastic steps: STEPS / per_step)."""
    results = {m: job.result(m) for m in members}
    first = results[members[0]]
    for m, r in results.items():
        assert r["weights"] == first["weights"], f"{m}'s weights differ from {members[0]}'s"
        assert r["momentum"] == first["momentum"], f"{m}'s optimizer state differs from {members[0]}'s"
        assert r["ledgers"] == {e: first["ledgers"][e] for e in r["ledgers"]}, f"{m}'s ledgers differ"
        assert str(EPOCHS - 1) in r["ledgers"], f"{m} did not finish the last epoch"
        assert (r["steps"], r["global_step"], r["current_epoch"]) == (STEPS // per_step, STEPS, EPOCHS), m
    assert sorted(first["ledgers"]) == [str(e) for e in epochs]
    steps = [s for s, _, _ in commits(first["ledgers"])]
    assert steps == list(range(epochs[0] * PER_EPOCH // per_step, STEPS // per_step)), "each step committed once"
    return results


def kill_and_join(elastic_job, tmp_path, kill_at, join_at, leave_at=None, **scenario):
    """A job of 4 under `mccl launch --local 4 --elastic --min-nodes 2` whose m2 is killed with SIGKILL in the
    step `kill_at`, whose m1 is asked to leave by `mccl leave` in the step `leave_at` (None: it stays), and which a
    rank started by `mccl join --local 1` joins at the step `join_at` (the scenario's other variables alike for
    all); the job once its launcher exited 0, having said so in the lines checked here."""
    pauses = f"m2:{kill_at}" + (f",m1:{leave_at}" if leave_at is not None else "")
    scenario = {"PAUSES": pauses, "AWAIT_JOIN_AT": join_at, **scenario}
    job = elastic_job(4, "--min-nodes", "2", program=LIGHTNING_RANK, **scenario)
    job.await_file("paused-m2")  # m2 waits in its training_step; the others wait for it in the step's allreduce
    os.kill(job.member_pid(2), signal.SIGKILL)
    if leave_at is not None:
        job.await_file("paused-m1")
        r = run_mccl("leave", "--master", f"127.0.0.1:{job.port}", "m1", timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stderr.strip() == (f"mccl: asked m1 to leave the job at 127.0.0.1:{job.port}: it leaves at the "
                                    f"next step boundary"), r.stderr
        (tmp_path / "go-m1").write_text("1")
    job.await_file("awaiting-join")  # the others wait at the step until j1 has posted
    joined = join_local(job, LIGHTNING_RANK,
                        [f"--env=ELASTIC_{k}={v}" for k, v in {"OUT": tmp_path, **scenario}.items()])
    assert f"mccl: joining 1 rank of local to the elastic job at 127.0.0.1:{job.port}" in joined, joined
    assert job.wait() == 0, job.output()
    out, err = job.stdout(), job.stderr().strip().splitlines()
    killed = f"step {kill_at}: m2 left (a collective failed on it and its heartbeat stopped ("
    assert f"[local r0] mccl elastic: {killed}" in out, job.output()
    assert "mccl: rank 2 on local exited with code 137 (killed by SIGKILL)" in err, job.output()
    stayed = ["m0", "m3", "j1"] if leave_at is not None else ["m0", "m1", "m3", "j1"]
    assert f"j1 joined; {len(stayed)} members now: {', '.join(stayed)}" in out, job.output()
    changes = [killed] + ([f"step {leave_at + 1}: m1 left (mccl leave)"] if leave_at is not None else [])
    assert err[-1].startswith(f"mccl: the elastic job finished with {len(stayed)} members ({', '.join(stayed)}); "
                              f"changes: {changes[0]}"), err[-1]
    assert all(change in err[-1] for change in changes[1:]) and f"step {join_at + 1}: j1 joined" in err[-1], err[-1]
    if leave_at is not None:
        assert job.result("m1")["left"] and job.result("m1")["steps"] == leave_at + 1  # it exited 0
    return job


def test_a_fit_goes_on_through_a_kill_a_slow_member_and_a_join(elastic_job, tmp_path):
    job = kill_and_join(elastic_job, tmp_path, KILL_AT, JOIN_AT, SAMPLE_S=0.03, SLOW_MEMBER="m3",
                        SLOW_FROM=SLOW_FROM)
    results = check_members(job, ["m0", "m1", "m3", "j1"])
    first = results["m0"]
    expected = replay(first["initial"], commits(first["ledgers"]))
    for got, want in zip(first["weights"], expected):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    assert results["j1"]["first_step"] == JOIN_AT + 1  # admitted at that step's boundary, it trains the next one
    batches = first["batches"]
    assert [b["step"] for b in batches] == list(range(1, STEPS + 1)), "one batch per committed step"
    sizes = [b["world_size"] for b in batches]
    assert sizes == [4] * KILL_AT + [3] * (JOIN_AT + 1 - KILL_AT) + [4] * (STEPS - JOIN_AT - 1), sizes
    assert all(b["global_rank"] == 0 and b["is_global_zero"] for b in batches)
    assert [b["global_rank"] for b in results["m3"]["batches"]][-1] == 2  # after m2 left, m3 is rank 2
    slow = [b["samples"] for b in results["m3"]["batches"] if 12 <= b["step"] <= JOIN_AT]
    fast = [b["samples"] for b in results["m1"]["batches"] if 12 <= b["step"] <= JOIN_AT]
    assert np.mean(slow) < 0.75 * np.mean(fast), (slow, fast)
    # host 0's logger alone, every step: the loss, and CommMetrics' members and shares (the slow member's fell)
    assert [p.name for p in tmp_path.glob("logs/*")] == ["version_0"]
    with open(tmp_path / "logs" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = [r for r in rows if r.get("comm/members")]
    members = [int(float(r["comm/members"])) for r in logged]
    assert [k for k, _ in itertools.groupby(members)] == [4, 3, 4], members
    shares = [(float(r["comm/share/m3"]), float(r["comm/share/m1"])) for r in logged if r.get("comm/share/m1")]
    assert sum(m3 for m3, _ in shares[-8:]) < 0.75 * sum(m1 for _, m1 in shares[-8:]), shares
    assert sum(1 for r in rows if r.get("train_loss")) == STEPS


def test_a_member_leaves_host_0_is_lost_and_the_checkpoint_resumes_on_2_members(elastic_job, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    job = elastic_job(4, program=LIGHTNING_RANK, PAUSES=f"m1:{KILL_AT},m0:{PER_EPOCH + 3}", CHECKPOINT=checkpoints)
    job.await_file("paused-m1")
    r = run_mccl("leave", "--master", f"127.0.0.1:{job.port}", "m1", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    (tmp_path / "go-m1").write_text("1")
    job.await_file("paused-m0")  # at epoch 1, after host 0 wrote the checkpoint of epoch 0
    os.kill(job.member_pid(0), signal.SIGKILL)
    assert job.wait() != 0, job.output()
    out = job.stdout()
    assert f"member m1 left the job at step {KILL_AT + 1}, as asked" in out, job.output()
    assert f"HostZeroLost: mccl elastic: {HOST_ZERO_MUST_STAY}" in out + job.stderr(), job.output()
    assert job.result("m1")["left"] and job.result("m1")["steps"] == KILL_AT + 1

    (tmp_path / "resumed").mkdir()
    resumed = ElasticJob(tmp_path / "resumed", 2, program=LIGHTNING_RANK, CHECKPOINT=checkpoints)
    try:
        assert resumed.wait() == 0, resumed.output()
    finally:
        resumed.kill()
    results = check_members(resumed, ["m0", "m1"], epochs=range(1, EPOCHS))
    assert results["m0"]["first_step"] == PER_EPOCH
    assert {b["world_size"] for b in results["m0"]["batches"]} == {2}


def diloco_replay(initial, rounds: dict, sync_every: int) -> np.ndarray:
    """Elastic DiLoCo's committed rounds again, in float64: each member's inner SGD steps from the anchor on its
    ids, `sync_every` batches in order (none for an empty one), then the anchor moved by the members' progress
    averaged by their samples (outer lr 1, no momentum). `rounds`: round -> {member: its ids}."""
    x, y = dataset()
    anchor = np.concatenate([np.ravel(p) for p in initial]).astype(np.float64)
    for r in sorted(rounds):
        total = sum(len(ids) for ids in rounds[r].values())
        progress = np.zeros_like(anchor)
        for ids in rounds[r].values():
            w = anchor.copy()
            for batch in np.array_split(np.array(ids, dtype=np.int64), sync_every):
                if len(batch):
                    residual = x[batch] @ w[:-1] + w[-1] - y[batch]
                    w -= LR * np.append(2 * x[batch].T @ residual, 2 * residual.sum()) / len(batch)
            progress += len(ids) / total * (anchor - w)
        anchor = anchor - progress
    return anchor


def test_elastic_diloco_goes_on_through_a_kill_a_slow_member_a_leave_and_a_join(elastic_job, tmp_path):
    h = 2
    rounds_per_epoch = PER_EPOCH // h
    job = kill_and_join(elastic_job, tmp_path, KILL_AT // h, 2 * rounds_per_epoch, leave_at=rounds_per_epoch + 2,
                        SYNC_EVERY=h, MOMENTUM=0, SAMPLE_S=0.03, SLOW_MEMBER="m3", SLOW_FROM=1)
    results = check_members(job, ["m0", "m3", "j1"], per_step=h)
    assert results["j1"]["first_step"] == (2 * rounds_per_epoch + 1) * h  # in batches: a round after it joined
    rounds = {}
    for path in tmp_path.glob("*.steps.jsonl"):  # every member's, the killed one's too
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            rounds.setdefault(entry["step"], {})[path.name.split(".")[0]] = entry["ids"]
    assert sorted(rounds) == list(range(STEPS // h))
    assert "m2" in rounds[0] and all("m2" not in rounds[r] for r in range(KILL_AT // h, STEPS // h))
    assert max(r for r in rounds if "m1" in rounds[r]) == rounds_per_epoch + 2  # the last round it trained
    later = range(6, rounds_per_epoch + 3)  # the slow member's share of a round fell (and stays above 0)
    slow, fast = (np.mean([len(rounds[r][m]) for r in later]) for m in ("m3", "m1"))
    assert 0 < slow < 0.75 * fast, (slow, fast)
    expected = diloco_replay(results["m0"]["initial"], rounds, h)
    np.testing.assert_allclose(np.concatenate([np.ravel(p) for p in results["m0"]["weights"]]), expected,
                               rtol=2e-4, atol=2e-5)
