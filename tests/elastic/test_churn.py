"""Members leave a running job, and join it, on real processes (elastic_rank.py: torch's DDP over the elastic
group, 4 CPU members, 3 epochs of 12 steps). After a member is killed with SIGKILL mid-step, or asked to leave
(SIGTERM, or its owner logging in, read from a stand-in for the console's owner), the others finish every epoch without a
restart; each epoch's ledger holds every sample id once; the survivors' weights are identical and equal a float64
replay of the committed steps. When host 0 dies, every other member ends with the documented sentence. (A member
that joins: test_lightning.py, under the launcher.)"""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from elastic_launch import Job
from elastic_rank import EPOCHS, GLOBAL_BATCH, LR, MOMENTUM, NUM_SAMPLES, dataset
from lightning_mccl.elastic import HOST_ZERO_MUST_STAY

pytestmark = pytest.mark.slow
START_S = 300.0  # four members import torch and reach the paused step (a loaded 2-core machine is slow)
RUN_S = 240.0  # then end
STEPS = EPOCHS * -(-NUM_SAMPLES // GLOBAL_BATCH)
PAUSE_AT = 5


def replay(initial, commits) -> list:
    """The committed steps again, in float64: SGD with momentum on the mean squared error of each global batch."""
    x, y = dataset()
    params = [np.array(p, dtype=np.float64) for p in initial]
    buffers = None
    for _, _, ids in sorted(commits):
        residual = x[ids] @ params[0] + params[1][0] - y[ids]
        grads = [2 * x[ids].T @ residual / len(ids), np.array([2 * residual.sum() / len(ids)])]
        buffers = grads if buffers is None else [MOMENTUM * b + g for b, g in zip(buffers, grads)]
        params = [p - LR * b for p, b in zip(params, buffers)]
    return params


def check_survivors(job: Job, survivors, reference_from="m0") -> dict:
    results = {m: job.result(m) for m in survivors}
    first = results[reference_from]
    commits = first["commits"]
    assert [c[0] for c in commits] == list(range(STEPS)), "every step was committed once, in order"
    for m, r in results.items():
        assert r["weights"] == first["weights"], f"{m}'s weights differ from {reference_from}'s"
        assert r["momentum"] == first["momentum"], f"{m}'s optimizer state differs from {reference_from}'s"
        assert r["ledgers"] == first["ledgers"], f"{m}'s ledgers differ from {reference_from}'s"
        assert r["steps"] == STEPS
    assert sorted(first["ledgers"]) == [str(e) for e in range(EPOCHS)]
    for epoch, ledger in first["ledgers"].items():
        ledger = np.array(ledger)
        assert (ledger >= 0).all(), f"epoch {epoch}: ids {np.flatnonzero(ledger < 0)} were never trained"
        for step, e, ids in commits:
            if str(e) == epoch:
                assert (ledger[ids] == step).all(), f"epoch {epoch}: the ledger disagrees with step {step}"
        counts = np.bincount(np.concatenate([ids for _, e, ids in commits if str(e) == epoch]), minlength=NUM_SAMPLES)
        assert (counts == 1).all(), f"epoch {epoch}: ids trained other than once: {np.flatnonzero(counts != 1)}"
    expected = replay(first["initial"], commits)
    for got, want in zip(first["weights"], expected):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    return results


def recovery(results: dict, t_event: float) -> str:
    """How long after `t_event` each member's step boundary was decided, and its next step started."""
    lines = []
    for m, r in results.items():
        bounds = r["boundaries"]
        i = next(i for i, b in enumerate(bounds) if b["end"] >= t_event)
        lines.append(f"{m}: boundary decided {bounds[i]['end'] - t_event:.2f} s after, next step started at "
                     f"{bounds[i + 1]['start'] - t_event:.2f} s, with {len(bounds[i + 1 + 0]['members'])} members")
    return "; ".join(lines)


@pytest.fixture
def job(tmp_path):
    made = []

    def start(world_size, **env):
        made.append(Job(tmp_path, world_size, {k: str(v) for k, v in env.items()}))
        return made[-1]

    yield start
    for j in made:
        j.kill_all()


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_member_killed_or_stopped_mid_step_the_others_finish_every_epoch(job, how):
    """SIGKILL closes its connections (the engine names it at once); SIGSTOP does not (the elastic group's engine
    heartbeat, 3 s here, names it). The stopped member, continued once the others went on, learns that it was
    taken out (Removed), and cannot carry on alone."""
    j = job(4, ELASTIC_PAUSE_MEMBER="m2", ELASTIC_PAUSE_AT=PAUSE_AT, ELASTIC_ENGINE_HEARTBEAT_S=3,
            ELASTIC_STEP_SLEEP=0.1)
    j.await_file("paused", START_S)
    t_fail = j.signal("m2", signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    if how == "stop":
        j.await_output("m0", "m2 left", RUN_S)
        (j.out / "go").write_text("1")
        j.signal("m2", signal.SIGCONT)
    codes = j.wait(RUN_S)
    assert codes == {"m0": 0, "m1": 0, "m2": -signal.SIGKILL if how == "kill" else 1, "m3": 0}, j.outputs()
    if how == "stop":
        assert "Removed: mccl elastic: member m2 " in j.output("m2"), j.output("m2")[-3000:]
    results = check_survivors(j, ["m0", "m1", "m3"])
    failed = [b for b in results["m0"]["boundaries"] if not b["committed"]]
    assert len(failed) == 1 and failed[0]["step"] == PAUSE_AT and "m2 is gone" in failed[0]["reason"]
    named = "lost its connection to rank 2" if how == "kill" else "heard nothing from rank 2"
    assert named in failed[0]["reason"], failed[0]["reason"]
    assert "m2 left (a collective failed on it" in j.output("m0") and "3 members now: m0, m1, m3" in j.output("m0")
    timing = recovery(results, t_fail)
    print(f"\n{how} -> {timing}")
    starts = [b["start"] for b in results["m0"]["boundaries"] if b["start"] > t_fail]
    assert starts and starts[0] - t_fail < (10.0 if how == "kill" else 15.0), timing


@pytest.mark.parametrize("how", ["sigterm", "login"])  # the leave log (`mccl leave`): test_lightning.py
def test_a_member_asked_to_leave_exits_0_and_the_others_finish(job, tmp_path, how):
    console = {"ELASTIC_CONSOLE": str(tmp_path / "console")} if how == "login" else {}
    j = job(4, ELASTIC_PAUSE_MEMBER="m2", ELASTIC_PAUSE_AT=PAUSE_AT, **console)
    j.await_file("paused", START_S)
    if how == "sigterm":
        t_ask = j.signal("m2", signal.SIGTERM)
    elif how == "login":  # every member watches its own file; m2's says someone logged in at its screen
        t_ask = time.time()
        (tmp_path / "console.2").write_text("alice\n")
    codes = j.wait(RUN_S)
    assert codes == {"m0": 0, "m1": 0, "m2": 0, "m3": 0}, j.outputs()
    results = check_survivors(j, ["m0", "m1", "m3"])
    leaver = j.result("m2")
    assert leaver["left"] and leaver["steps"] == PAUSE_AT + 1  # its last step was applied by everyone
    assert all(b["committed"] for b in results["m0"]["boundaries"])
    why = {"sigterm": "it got SIGTERM", "login": "its owner alice logged in at the console"}[how]
    assert f"m2 left ({why})" in j.output("m0") and f"member m2 left the job at step {PAUSE_AT + 1}" in j.output("m2")
    print(f"\nleave ({how}) -> {recovery(results, t_ask)}")


def test_host_0_dying_ends_every_other_member_with_the_documented_sentence(job):
    j = job(4, ELASTIC_PAUSE_MEMBER="m0", ELASTIC_PAUSE_AT=PAUSE_AT)
    j.await_file("paused", START_S)
    t_kill = j.signal("m0", signal.SIGKILL)
    codes = j.wait(RUN_S)
    t_end = time.time()
    assert codes["m0"] == -signal.SIGKILL and all(codes[m] == 1 for m in ("m1", "m2", "m3")), j.outputs()
    for m in ("m1", "m2", "m3"):
        out = j.output(m)
        assert "HostZeroLost: mccl elastic: " + HOST_ZERO_MUST_STAY in out, out[-3000:]
        assert f"Member {m} lost the Store at 127.0.0.1:{j.port}" in out
    raised = max(float(p.read_text()) for p in j.out.glob("failed-*")) - t_kill
    print(f"\nhost 0 killed -> every other member raised HostZeroLost within {raised:.2f} s and exited within "
          f"{t_end - t_kill:.1f} s")
    assert raised < 10.0
