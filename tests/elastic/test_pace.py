"""Pace by speed. The shares (whole counts summing to the global batch, in proportion to the posted rates, none
under the minimum, the median for a member not measured yet, largest remainders with ties in rank order, the same
on every call); the speedometer (its own work only, not its wait for the others' collectives; the warm-up step,
failed and empty steps not measured; a moving average); the boundary's decision carrying them. On real processes
(elastic_rank.py, 4 CPU members, one dropping to half speed mid-run: its step then sleeps twice as long per
sample), its share falls to about half of the others' within a few steps, every sample of every epoch is trained
once, and every member ends with the same weights, equal to a float64 replay; with pacing off the shares stay
equal."""
from __future__ import annotations

import random
import time

import numpy as np
import pytest

from elastic_launch import Job
from elastic_rank import NUM_SAMPLES
from lightning_mccl.elastic import pace
from lightning_mccl.elastic.membership import Post
from lightning_mccl.elastic.pace import Speedometer, changed_materially, equal_shares, paced_shares
from lightning_mccl.elastic.settings import ElasticSettings
from test_churn import replay
from test_membership import SETTINGS, World

# ---- the shares -----------------------------------------------------------------------------------------------


def test_shares_follow_the_rates_and_sum_to_the_batch():
    # 64 * 2/7 = 18.29 (three times) and 64 * 1/7 = 9.14: one sample left, to the largest remainder, the first
    assert paced_shares([2.0, 2.0, 2.0, 1.0], 64, 0.25) == (19, 18, 18, 9)
    assert paced_shares([45.0, 44.0, 22.0, 46.0], 64, 0.25) == (18, 18, 9, 19)


def test_no_member_gets_less_than_the_minimum():
    # the minimum is a quarter of an equal share of 64 among 4: 4; the others share the remaining 60 by rate
    assert paced_shares([100.0, 100.0, 100.0, 1.0], 64, 0.25) == (20, 20, 20, 4)
    assert paced_shares([100.0, 1.0, 1.0, 50.0], 64, 0.25) == (37, 4, 4, 19)  # 56 left, 2:1
    assert paced_shares([100.0, 100.0, 100.0, 1.0], 8, 0.25) == (3, 2, 2, 1)  # one sample, to go on measuring
    assert paced_shares([100.0, 100.0, 1.0], 2, 0.25) == (1, 1, 0)  # fewer samples than members


def test_a_member_without_a_rate_weighs_the_median_and_nobody_with_one_means_equal():
    assert paced_shares([10.0, 0.0, 30.0, 20.0], 80, 0.25) == (10, 20, 30, 20)
    assert paced_shares([0.0, 0.0, 0.0], 10, 0.25) == (4, 3, 3) == equal_shares(3, 10)


def test_ties_go_to_the_earlier_member_in_rank_order():
    assert paced_shares([1.0, 1.0, 1.0], 11, 0.5) == (4, 4, 3)
    assert paced_shares([3.0, 1.0, 1.0, 1.0], 7, 0.1) == (4, 1, 1, 1)  # 3.5, 1.17 x 3: the half sample to m0


@pytest.mark.parametrize("seed", range(3))
def test_shares_over_random_rates_sum_exactly_respect_the_minimum_and_are_deterministic(seed):
    rng = random.Random(seed)
    for _ in range(300):
        n, total, least = rng.randint(1, 9), rng.randint(1, 300), rng.choice([0.1, 0.25, 0.5, 0.9])
        rates = [rng.choice([0.0, rng.uniform(0.1, 1000.0)]) for _ in range(n)]
        shares = paced_shares(rates, total, least)
        assert sum(shares) == total and len(shares) == n and all(isinstance(s, int) for s in shares)
        minimum = max(least * total / n, 1 if total >= n else 0)
        assert min(shares) >= int(minimum)
        assert paced_shares(list(rates), total, least) == shares  # from the same values, the same shares
        known = [r for r in rates if r > 0]
        weights = [r or (float(np.median(known)) if known else 1.0) for r in rates]
        for i in range(n):
            for j in range(n):
                if weights[i] > weights[j]:  # a faster member never gets fewer samples, but where both are held
                    assert shares[i] >= shares[j] - (i > j)  # at the minimum: a tie, to the earlier member
        exact = [total * w / sum(weights) for w in weights]
        if min(exact) >= minimum:  # nobody held at the minimum: within a sample of its part
            assert all(abs(s - e) < 1 for s, e in zip(shares, exact))


def test_shares_refuse_bad_input_naming_it():
    with pytest.raises(ValueError, match="rates must be finite and non-negative"):
        paced_shares([1.0, -1.0], 8, 0.25)
    with pytest.raises(ValueError, match="min_share=1 must be between 0 and 1"):
        paced_shares([1.0], 8, 1)
    with pytest.raises(ValueError, match="no members"):
        paced_shares([], 8, 0.25)


def test_a_share_line_is_for_material_changes_only():
    members = ("m0", "m1", "m2", "m3")
    assert not changed_materially(((), ()), members, (16, 16, 16, 16))  # equal: nothing to say
    assert changed_materially(((), ()), members, (19, 18, 18, 9))
    assert not changed_materially((members, (19, 18, 18, 9)), members, (18, 18, 19, 9))  # one sample: noise
    assert changed_materially((members, (19, 18, 18, 9)), members, (17, 17, 17, 13))
    assert changed_materially((members, (19, 18, 18, 9)), members[:3], (25, 24, 15))  # others, unequal


def test_the_settings_are_checked_naming_the_setting():
    with pytest.raises(ValueError, match="pace_smoothing=1.5 must be at most 1"):
        ElasticSettings(pace_smoothing=1.5)
    with pytest.raises(ValueError, match="pace_min_share=1 must be less than 1"):
        ElasticSettings(pace_min_share=1)
    with pytest.raises(ValueError, match="pace_min_share=0 must be positive"):
        ElasticSettings(pace_min_share=0)
    with pytest.raises(ValueError, match="pace_after_steps=2.5 must be a whole number"):
        ElasticSettings(pace_after_steps=2.5)
    with pytest.raises(ValueError, match="pace='yes' must be True or False"):
        ElasticSettings(pace="yes")
    assert not ElasticSettings(pace=False).pace


# ---- the speedometer ------------------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_speedometer_measures_the_members_own_work_smoothed(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(pace.time, "monotonic", clock)
    speed = Speedometer(smoothing=0.5, after_steps=2)

    def step(samples, work, wait=0.0, ok=True):
        speed.start()
        clock.now += work
        speed.issued()  # its backward is done: the last gradient bucket goes out
        clock.now += wait  # the others are slower
        speed.completed()
        speed.stop(samples, ok)

    step(10, 5.0)  # the warm-up step: not measured
    assert (speed.measured, speed.rate) == (0, 0.0)
    step(10, 1.0, wait=3.0)  # 10 samples in 1 s of its own: the 3 s waiting for the others do not count
    assert (speed.measured, speed.rate) == (1, 0.0)  # not yet counted: after 2 measured steps
    step(10, 0.5)
    assert speed.rate == pytest.approx(0.5 * 20 + 0.5 * 10)
    step(0, 1.0)  # no samples, and a failed step: not measured
    step(10, 9.0, ok=False)
    assert speed.measured == 2 and speed.rate == pytest.approx(15.0)
    speed.start()  # a step without collectives (no DDP, or the group was re-forming): all of it is work
    clock.now += 2.0
    speed.stop(10, ok=True)
    assert speed.rate == pytest.approx(0.5 * 5 + 0.5 * 15)


# ---- the boundary's decision ----------------------------------------------------------------------------------


def test_the_decision_carries_the_shares_paced_by_the_posted_rates():
    w = World(4)
    try:
        w.round({m: Post(ok=True, digest="d") for m in w.members})
        rates = {"m0": 40.0, "m1": 40.0, "m2": 20.0, "m3": 0.0}
        d = w.round({m: Post(ok=True, digest="d", rate=rates[m]) for m in w.members})["m2"]
        assert d.rates == (40.0, 40.0, 20.0, 0.0)
        assert d.shares == paced_shares([40.0, 40.0, 20.0, 0.0], 12, SETTINGS.pace_min_share) == (4, 3, 2, 3)
    finally:
        w.close()


def test_with_pace_off_the_decision_deals_equal_shares():
    w = World(4, settings=ElasticSettings(timeout=20.0, heartbeat_s=0.05, silent_after_s=1.5, suspect_grace_s=0.25,
                                          pace=False))
    try:
        d = w.round({m: Post(ok=True, digest="d", rate=10.0 * (i + 1)) for i, m in enumerate(w.members)})["m1"]
        assert d.shares == (3, 3, 3, 3) and d.rates == (0.0, 0.0, 0.0, 0.0)
    finally:
        w.close()


# ---- on real processes ----------------------------------------------------------------------------------------

START_S = 300.0  # four members import torch (a loaded 2-core machine is slow)
RUN_S = 120.0
SAMPLE_S = 0.02  # each sample's compute, slept; twice that on the slow member
BATCH, EPOCHS = 32, 5
STEPS = EPOCHS * -(-NUM_SAMPLES // BATCH)
EQUAL = {"m0": 8, "m1": 8, "m2": 8, "m3": 8}
PACED_FROM = 1 + ElasticSettings().pace_after_steps  # the warm-up step, then the measured ones
SLOW_FROM = PACED_FROM + 2  # m3 drops to half speed once the members are paced
SETTLED_AFTER = 3  # steps after the drop by which m3's share is about half of the others'


def run_job(tmp_path, pace_on: bool) -> dict:
    job = Job(tmp_path, 4, {"ELASTIC_SAMPLE_S": str(SAMPLE_S), "ELASTIC_SLOW_MEMBER": "m3",
                            "ELASTIC_SLOW_FROM": str(SLOW_FROM), "ELASTIC_PACE": "1" if pace_on else "0",
                            "ELASTIC_GLOBAL_BATCH": str(BATCH), "ELASTIC_EPOCHS": str(EPOCHS)})
    try:
        codes = job.wait(START_S + RUN_S)
    finally:
        job.kill_all()
    assert codes == {f"m{r}": 0 for r in range(4)}, job.outputs()
    results = {m: job.result(m) for m in codes}
    first = results["m0"]
    commits = first["commits"]
    assert [c[0] for c in commits] == list(range(STEPS)), "every step was committed once, in order"
    for m, r in results.items():
        assert r["weights"] == first["weights"] and r["momentum"] == first["momentum"], f"{m} differs from m0"
        assert r["ledgers"] == first["ledgers"], f"{m}'s ledgers differ from m0's"
    assert sorted(first["ledgers"]) == [str(e) for e in range(EPOCHS)]
    for epoch, ledger in first["ledgers"].items():
        trained = np.concatenate([ids for _, e, ids in commits if str(e) == epoch])
        assert (np.bincount(trained, minlength=NUM_SAMPLES) == 1).all(), f"epoch {epoch}: an id not trained once"
        assert (np.array(ledger) >= 0).all()
    for got, want in zip(first["weights"], replay(first["initial"], commits)):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)  # the gradient of the global batch's mean
    shares = [b["shares"] for b in first["boundaries"]]
    assert all(s == results[m]["boundaries"][i]["shares"] for m in results for i, s in enumerate(shares))
    return {"shares": shares, "output": job.output("m0")}


@pytest.mark.slow
def test_a_member_that_drops_to_half_speed_gets_about_half_the_share(tmp_path):
    started = time.monotonic()
    run = run_job(tmp_path, pace_on=True)
    shares = run["shares"]
    print(f"\nshares by step: {[list(s.values()) for s in shares]} ({time.monotonic() - started:.1f} s)")
    assert shares[:PACED_FROM] == [EQUAL] * PACED_FROM  # nobody has measured enough yet
    for s in shares[PACED_FROM:SLOW_FROM]:  # paced, at equal speeds: about equal
        assert all(abs(n - 8) <= 1 for n in s.values()), s
    ratios = [s["m3"] / np.mean([s["m0"], s["m1"], s["m2"]]) for s in shares[SLOW_FROM + SETTLED_AFTER:]]
    assert len(ratios) >= 4 and all(0.3 <= r <= 0.75 for r in ratios), ratios
    assert ": shares by speed m0 " in run["output"], run["output"]


@pytest.mark.slow
def test_with_pace_off_the_shares_stay_equal(tmp_path):
    run = run_job(tmp_path, pace_on=False)
    assert run["shares"] == [EQUAL] * STEPS, run["shares"]
    assert "shares by speed" not in run["output"]
