"""The elastic sampler: every id of an epoch trained exactly once whatever the churn (a ledger property over
random churn sequences with a fixed seed), the global batch constant, shares dealt by largest remainders, a
dropped step's ids dealt again whole, and its state as a joiner receives it."""
from __future__ import annotations

import random

import numpy as np
import pytest

from lightning_mccl.elastic.sampler import UNTRAINED, ElasticSampler, split_sizes

SEQUENCES = 200


def _churn(rng: random.Random, members: list, next_id: list) -> list:
    """The next step's members: someone may leave (never the last), someone may join."""
    members = list(members)
    if len(members) > 1 and rng.random() < 0.25:
        members.pop(rng.randrange(len(members)))
    if rng.random() < 0.25:
        next_id[0] += 1
        members.insert(rng.randrange(len(members) + 1), f"j{next_id[0]}")
    return members


@pytest.mark.parametrize("seed", range(4))
def test_every_id_of_every_epoch_is_trained_once_under_random_churn(seed):
    rng = random.Random(seed)
    for _ in range(SEQUENCES // 4):
        n, batch = rng.randint(1, 60), rng.randint(1, 13)
        sampler = ElasticSampler(n, batch, seed=rng.randrange(1000))
        members, next_id = [f"m{i}" for i in range(rng.randint(1, 6))], [0]
        step, epochs, dropped = 0, rng.randint(1, 3), None
        while sampler.epoch < epochs:
            members = _churn(rng, members, next_id)
            shares = [rng.choice([0.5, 1.0, 2.0, 3.0]) for _ in members] if rng.random() < 0.5 else None
            deal = sampler.deal(members, shares)
            left_before = n - int((sampler.ledger() != UNTRAINED).sum())
            assert len(deal.ids) == min(batch, left_before)  # the global batch is constant but for the last step
            if dropped is not None:
                assert np.array_equal(deal.ids, dropped)  # a dropped step's ids are dealt again, whole
            together = np.concatenate([deal.of(m) for m in members])
            assert np.array_equal(together, deal.ids)  # the slices partition the step in member order
            weights = shares or [1.0] * len(members)
            for m, w in zip(members, weights):
                assert abs(len(deal.of(m)) - len(deal.ids) * w / sum(weights)) < 1
            if rng.random() < 0.3:
                sampler.drop()
                dropped = deal.ids
                continue
            sampler.commit(step)
            step, dropped = step + 1, None
            if sampler.epoch_done:
                ledger = sampler.ledger()
                assert (ledger != UNTRAINED).all(), f"ids {np.flatnonzero(ledger == UNTRAINED)} never trained"
                trained = np.concatenate([np.flatnonzero(ledger == s) for s in np.unique(ledger)])
                assert sorted(trained.tolist()) == list(range(n))  # each id once, by one step
                sampler.next_epoch()


def test_each_epoch_is_its_own_seeded_permutation():
    a, b = ElasticSampler(50, 50, seed=3), ElasticSampler(50, 50, seed=3)
    first = a.deal(["m0"]).ids
    assert np.array_equal(first, b.deal(["m0", "m1"]).ids)
    assert sorted(first.tolist()) == list(range(50))
    a.commit(0)
    a.next_epoch()
    assert not np.array_equal(a.deal(["m0"]).ids, first)
    assert not np.array_equal(ElasticSampler(50, 50, seed=4).deal(["m0"]).ids, first)


def test_a_joiner_that_loads_the_state_deals_what_the_others_deal():
    holder = ElasticSampler(40, 6, seed=1)
    for step in range(3):
        holder.deal(["m0", "m1"])
        holder.commit(step)
    holder.deal(["m0", "m1"])
    holder.drop()  # ids given back: part of the state
    joiner = ElasticSampler(40, 6, seed=1)
    joiner.load_state_dict(holder.state_dict())
    assert joiner.digest() == holder.digest()
    assert np.array_equal(joiner.ledger(), holder.ledger())
    for step in range(3, 7):
        a, b = holder.deal(["m0", "j1"]), joiner.deal(["m0", "j1"])
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.of("j1"), b.of("j1"))
        holder.commit(step)
        joiner.commit(step)
        assert joiner.digest() == holder.digest()


def test_digest_tells_states_apart():
    a, b = ElasticSampler(30, 4), ElasticSampler(30, 4)
    a.deal(["m0"])
    b.deal(["m0"])
    a.commit(0)
    b.commit(1)  # the same ids, recorded under another step
    assert a.digest() != b.digest()


def test_misuse_is_a_clear_error():
    sampler = ElasticSampler(10, 4)
    with pytest.raises(RuntimeError, match="no step was dealt"):
        sampler.commit(0)
    sampler.deal(["m0"])
    with pytest.raises(RuntimeError, match="neither committed nor dropped"):
        sampler.deal(["m0"])
    with pytest.raises(RuntimeError, match="in flight"):
        sampler.state_dict()
    sampler.commit(0)
    with pytest.raises(RuntimeError, match="still has ids to train"):
        sampler.next_epoch()
    with pytest.raises(ValueError, match="not unique"):
        sampler.deal(["m0", "m0"])
    with pytest.raises(ValueError, match=r"2 shares for 1 members"):
        sampler.deal(["m0"], [1, 1])
    with pytest.raises(ValueError, match=r"\(num_samples, global_batch, seed\) = \(10, 5, 0\)"):
        sampler.load_state_dict(ElasticSampler(10, 5).state_dict())
    with pytest.raises(ValueError, match="num_samples >= 1"):
        ElasticSampler(0, 4)


def test_a_step_cannot_train_an_id_twice():
    sampler = ElasticSampler(8, 4)
    deal = sampler.deal(["m0"])
    sampler.commit(0)
    sampler._in_flight = deal.ids  # what a bug in the caller would do: commit the same ids again
    with pytest.raises(RuntimeError, match="already trained"):
        sampler.commit(1)


def test_split_sizes():
    assert split_sizes(10, [1, 1, 1]) == [4, 3, 3]
    assert split_sizes(2, [1, 1, 1]) == [1, 1, 0]
    assert split_sizes(12, [1, 2, 3]) == [2, 4, 6]
    assert split_sizes(7, [1, 0, 1]) == [4, 0, 3]
    with pytest.raises(ValueError, match="positive sum"):
        split_sizes(3, [0, 0])
