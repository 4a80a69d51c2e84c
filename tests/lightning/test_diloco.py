"""lightning_mccl.diloco on 3 CPU ranks (raw torch, lightning_mccl.testing.run_ranks), against a float64
reference of the schedule written independently of the module (each rank's weights = the new anchor + its
progress since the round's end; the outer step as torch's SGD with nesterov=True computes it):

- the anchor after every inner step, for a delay of one step and of a whole round ("one round late"), with
  the outer momentum and learning rate of each; identical bits on every rank; buffers replaced by their mean;
  every rank holding the anchor after finish();
- one allreduce per round on the outer group (fragments=1: the whole model at the round's end), nothing on
  the default group while training, and half the bytes with MCCL_WIRE_DTYPE=bf16 in the outer group's
  settings, and with CastMean's cast to bf16 (on CUDA where there is one, as the strategy does on an
  accelerator); with the 8-bit allreduce (Int8Mean) about a quarter, within its bound of the float32 run, its
  residual carried from round to round and in state_dict();
- a DiLoCo rebuilt from state_dict() taken mid-round, with a sync in flight, ends bit-identical to the
  uninterrupted run;
- a rank that dies during an outer sync: DistBackendError naming the round on every other rank, anchor and
  weights untouched;
- bad settings: ValueError naming each.

The inner "optimizer" is a deterministic update per (step, rank) that the reference replays (`inner_update`).
"""
from __future__ import annotations

import os
import sys
import zlib

import numpy as np
import pytest
import torch

TORCH_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch")
if TORCH_TESTS not in sys.path:
    sys.path.insert(0, TORCH_TESTS)

from lightning_mccl.testing import RunFailed, run_ranks  # noqa: E402

WORLD = 3
# name: (sync_every, sync_delay, outer_lr, outer_momentum, wire, inner steps, state_dict taken after step)
CONFIGS = {
    "delay1": (3, 1, 0.7, 0.9, "off", 11, 6),  # taken while round 2's sync is in flight
    "round_late": (4, 4, 1.0, 0.5, "off", 14, 9),  # a whole round late; taken mid-round, sync in flight
    "bf16": (2, 2, 0.7, 0.9, "bf16", 8, None),
    "fp32_twin": (2, 2, 0.7, 0.9, "off", 8, None),
    "bf16_cast": (2, 2, 0.7, 0.9, "cast", 8, None),  # CastMean: cast to bf16 first, as on an accelerator
    "int8": (2, 2, 0.7, 0.9, "int8", 8, 5),  # the same updates as fp32_twin; taken with round 3's sync in flight
}
# Configs whose model lives on CUDA where there is one (the GPU host's run.sh cuda-tests runs this file): the
# cast and its staging on the device; elsewhere they run on the CPU.
ON_DEVICE = ("bf16_cast",)


class Toy(torch.nn.Module):
    """Two trainable parameters, a frozen one, a float buffer (averaged) and an integer one (left alone)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(torch.randn(5, generator=g))
        self.b = torch.nn.Parameter(torch.randn(2, 3, generator=g))
        self.frozen = torch.nn.Parameter(torch.randn(2, generator=g), requires_grad=False)
        self.register_buffer("stat", torch.randn(3, generator=g))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))


def inner_update(config: str, step: int, rank: int):
    """What rank `rank`'s inner step `step` (1-based) adds to a and b, and the new value it mixes into stat."""
    every, delay, _, _, _, steps, _ = CONFIGS[config]  # bf16 and its fp32 twin train on the same updates
    g = torch.Generator().manual_seed(zlib.crc32(f"{every}/{delay}/{steps}/{step}/{rank}".encode()))
    f64 = dict(generator=g, dtype=torch.float64)
    return 0.1 * torch.randn(5, **f64), 0.1 * torch.randn(2, 3, **f64), torch.randn(3, **f64)


def train(model, outer, config, first, last, rank):
    """Inner steps first..last (1-based) on `model`, each followed by outer.step(); the anchor after each (on
    the CPU)."""
    anchors = []
    device = model.a.device
    for step in range(first, last + 1):
        da, db, stat = (u.float().to(device) for u in inner_update(config, step, rank))
        with torch.no_grad():
            model.a.add_(da)
            model.b.add_(db)
            model.stat.mul_(0.5).add_(stat, alpha=0.5)
            model.count.add_(1)
        outer.step()
        anchors.append(outer.anchor.cpu().clone())
    return anchors


def on_cpu(state):
    return {k: v.cpu().clone() for k, v in state.items()}


def schedule_worker(rank, world):
    import torch.distributed as dist

    import lightning_mccl
    from lightning_mccl import wire_policy
    from lightning_mccl.diloco import AllreduceMean, CastMean, DiLoCo, Int8Mean, averaging_for, outer_group

    def strategys(compress, device_type):  # the averaging MCCLDiLoCoStrategy(compress=...) uses there
        return type(averaging_for(wire_policy.resolve(compress, device_type, "mccl", "test", diloco=True), group))

    out = {}
    for name, (every, delay, lr, mu, wire, steps, taken) in CONFIGS.items():
        group = outer_group({} if wire in ("int8", "cast") else {"MCCL_WIRE_DTYPE": wire})
        averaging = {"int8": lambda: Int8Mean(group),
                     "cast": lambda: CastMean(torch.bfloat16, group)}.get(wire, lambda: AllreduceMean(group))
        device = torch.device("cuda" if name in ON_DEVICE and torch.cuda.is_available() else "cpu")
        # the strategy's choice (averaging_for): the wire path for 16 bits on the CPU, the cast on an accelerator
        chosen = strategys(None if wire in ("off", "cast") else wire, "cpu")
        assert chosen is {"int8": Int8Mean}.get(wire, AllreduceMean), (name, chosen)
        assert strategys("bf16", "meta") is CastMean
        assert strategys("bf16", device.type) is (CastMean if device.type == "cuda" else AllreduceMean)
        model = Toy(seed=rank).to(device)  # different on every rank until the broadcast
        default_before = lightning_mccl.stats()["kinds"].get("allreduce", {}).get("calls", 0)
        outer = DiLoCo(model, every, outer_lr=lr, outer_momentum=mu, sync_delay=delay, fragments=1,
                       averaging=averaging())
        outer.broadcast()
        start = on_cpu(model.state_dict())
        anchors = train(model, outer, name, 1, taken or steps, rank)
        if taken:
            state = outer.state_dict()
            weights = on_cpu(model.state_dict())
            anchors += train(model, outer, name, taken + 1, steps, rank)
        outer.finish()
        counters = lightning_mccl.stats(group)["kinds"]
        default_allreduces = lightning_mccl.stats()["kinds"].get("allreduce", {}).get("calls", 0) - default_before
        resumed = None
        if taken:
            twin = Toy(seed=100 + rank)
            twin.load_state_dict(weights)
            again = DiLoCo(twin, every, outer_lr=lr, outer_momentum=mu, sync_delay=delay, fragments=1,
                           averaging=averaging())
            again.load_state_dict(state)
            train(twin, again, name, taken + 1, steps, rank)
            again.finish()
            resumed = on_cpu(twin.state_dict())
        out[name] = {"start": start, "anchors": torch.stack(anchors), "final": on_cpu(model.state_dict()),
                     "final_anchor": outer.anchor.cpu().clone(), "device": device.type, "resumed": resumed,
                     "rounds": outer.rounds,
                     "allreduces": counters["allreduce"]["calls"], "bytes": counters["allreduce"]["bytes_sent"],
                     "default_allreduces": default_allreduces,
                     "residual": state["averaging"] if taken else None}
        dist.destroy_process_group(group)
    return out


def reference(name):
    """float64: the anchor after every step, the final weights and stat, the number of rounds."""
    every, delay, lr, mu, _, steps, _ = CONFIGS[name]
    start = Toy(seed=0)
    anchor = torch.cat([start.a.detach().double(), start.b.detach().double().reshape(-1)])
    w = [anchor.clone() for _ in range(WORLD)]
    stat = [start.stat.double().clone() for _ in range(WORLD)]
    m = torch.zeros_like(anchor)
    pending, round_start, rounds, anchors = None, 0, 0, []

    def begin(step):
        nonlocal pending, round_start, rounds
        pending = (step, [x.clone() for x in w], sum(anchor - x for x in w) / WORLD, sum(stat) / WORLD)
        round_start, rounds = step, rounds + 1

    def apply():
        nonlocal anchor, m, pending
        _, at_end, mean, stat_mean = pending
        m = mu * m + mean
        anchor = anchor - lr * (mean + mu * m)
        for i in range(WORLD):
            w[i] = anchor + (w[i] - at_end[i])
            stat[i] = stat_mean.clone()
        pending = None

    for step in range(1, steps + 1):
        for i in range(WORLD):
            da, db, new = inner_update(name, step, i)
            w[i] = w[i] + torch.cat([da, db.reshape(-1)])
            stat[i] = 0.5 * stat[i] + 0.5 * new
        if pending is not None and step - pending[0] == delay:
            apply()
        if step - round_start == every:
            begin(step)
        anchors.append(anchor.clone())
    if pending is not None:
        apply()
    if steps > round_start:
        begin(steps)
        apply()
    return torch.stack(anchors), anchor, stat[0], rounds


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(schedule_worker, WORLD, backend="mccl", timeout=120)  # stats() reads mccl groups


@pytest.mark.parametrize("name", ["delay1", "round_late", "fp32_twin"])
def test_the_anchor_follows_the_float64_schedule_and_is_the_same_on_every_rank(ranks, name):
    anchors, final_anchor, stat, rounds = reference(name)
    rank0 = ranks[0][name]
    for r in range(WORLD):
        got = ranks[r][name]
        assert np.array_equal(got["anchors"], rank0["anchors"]), f"rank {r}'s anchor differs from rank 0's"
        for key in ("a", "b", "frozen", "stat", "count"):
            assert np.array_equal(got["start"][key], rank0["start"][key]), f"rank {r} did not start from rank 0's {key}"
            assert np.array_equal(got["final"][key], rank0["final"][key]), f"rank {r} ends with another {key}"
        assert got["rounds"] == got["allreduces"] == rounds, (got["rounds"], got["allreduces"], rounds)
        assert got["default_allreduces"] == 0, "an allreduce ran on the default group"
    np.testing.assert_allclose(rank0["anchors"], anchors.numpy(), rtol=1e-5, atol=1e-6)
    final = np.concatenate([rank0["final"]["a"], rank0["final"]["b"].reshape(-1)])
    assert np.array_equal(final, rank0["final_anchor"]), "finish() did not leave the anchor in the weights"
    np.testing.assert_allclose(final, final_anchor.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rank0["final"]["stat"], stat.numpy(), rtol=1e-5, atol=1e-6)
    assert int(rank0["final"]["count"]) == CONFIGS[name][5]  # integer buffers are left alone
    moved = np.abs(rank0["anchors"][-1] - rank0["anchors"][0]).max()
    assert moved > 0.05, "the anchor hardly moved: the schedule was not exercised"


@pytest.mark.parametrize("name", ["bf16", "bf16_cast"])
def test_bf16_pseudo_gradients_take_half_the_bytes_and_stay_within_bf16_rounding(ranks, name):
    """bf16: the outer group's engine narrows the allreduce to bf16 on the wire; bf16_cast: CastMean casts the
    vector to bf16 first and the engine sums bf16 values. Either way every rank ends with the same anchor. Error
    bound: the sum of 3 values, each contribution and each partial sum rounded once (u = 2^-8), is off by at most
    3u M + 2u (3M) = 9u M, its mean by 3u M (M = max|delta|); the pseudo-gradients are the same in both runs (the
    inner updates do not depend on the weights), and T rounds of Nesterov steps add at most lr T e / (1 - mu)."""
    every, _, lr, mu, _, steps, _ = CONFIGS[name]
    bf16, fp32 = ranks[0][name], ranks[0]["fp32_twin"]
    assert bf16["device"] == ("cuda" if name in ON_DEVICE and torch.cuda.is_available() else "cpu")
    assert bf16["allreduces"] == fp32["allreduces"] == steps // every
    assert bf16["bytes"] * 2 == fp32["bytes"] > 0
    for r in range(WORLD):
        assert np.array_equal(ranks[r][name]["anchors"], bf16["anchors"])
    deltas = [sum(torch.cat([u[0], u[1].reshape(-1)]) for u in (inner_update(name, s, r)
                                                              for s in range(k * every + 1, (k + 1) * every + 1)))
              for k in range(steps // every) for r in range(WORLD)]
    bound = lr * (steps // every) * 3 * 2.0**-8 * max(float(d.abs().max()) for d in deltas) / (1 - mu)
    diff = np.abs(bf16["anchors"] - fp32["anchors"]).max()
    assert 0 < diff <= bound, (diff, bound)


def test_int8_pseudo_gradients_take_a_quarter_of_the_bytes_with_error_feedback_and_stay_within_their_bound(ranks):
    """The 8-bit allreduce (256 values per float32 scale): about a quarter of float32's bytes (plus the scales), the
    same anchor on every rank, and each rank's residual (what its quantisation lost) kept for the next round. Error
    bound per mean value: a contribution and the result each quantised once, at most half a step of max|x|/126,
    the contributions carrying their residuals (at most as much again): 3 max|delta| / 126 is generous; T rounds
    of Nesterov steps add at most lr T e / (1 - mu)."""
    every, _, lr, mu, _, steps, _ = CONFIGS["int8"]
    int8, fp32 = ranks[0]["int8"], ranks[0]["fp32_twin"]
    assert int8["allreduces"] == fp32["allreduces"] == steps // every
    # Rank 0's bytes, exactly: the 14 values (a, b, stat) are one block, and segments are whole blocks, so rank 0
    # owns them all: it sends no contribution and the finished block to both others, 1 byte a value and a 4-byte
    # scale. Float32's ring sends 4 bytes a value.
    wire = lambda values: values + 4  # noqa: E731
    assert int8["bytes"] == (steps // every) * 2 * wire(14), (int8["bytes"], fp32["bytes"])
    for r in range(WORLD):
        assert np.array_equal(ranks[r]["int8"]["anchors"], int8["anchors"])
        residuals = ranks[r]["int8"]["residual"]
        assert residuals and all(np.abs(v).max() > 0 for v in residuals.values()), residuals
    deltas = [sum(torch.cat([u[0], u[1].reshape(-1)]) for u in (inner_update("int8", s, r)
                                                              for s in range(k * every + 1, (k + 1) * every + 1)))
              for k in range(steps // every) for r in range(WORLD)]
    bound = lr * (steps // every) * 3 * max(float(d.abs().max()) for d in deltas) / 126 / (1 - mu)
    diff = np.abs(int8["anchors"] - fp32["anchors"]).max()
    assert 0 < diff <= bound, (diff, bound)


@pytest.mark.parametrize("name", ["delay1", "round_late", "int8"])
def test_resuming_from_a_state_dict_taken_mid_round_equals_the_uninterrupted_run(ranks, name):
    for r in range(WORLD):
        got = ranks[r][name]
        for key, value in got["final"].items():
            assert np.array_equal(got["resumed"][key], value), f"rank {r} {key}: the resumed run differs"


def dying_worker(rank, world):
    """Rank 2 dies at the end of round 1 (before its part of the allreduce); the others wait for it one step
    later."""
    from lightning_mccl.diloco import AllreduceMean, DiLoCo, outer_group

    model = Toy(seed=rank)
    outer = DiLoCo(model, 2, sync_delay=2, fragments=1, averaging=AllreduceMean(outer_group()))
    outer.broadcast()
    for step in (1, 2, 3, 4):
        with torch.no_grad():
            model.a.add_(0.1 * (rank + 1))
        if step == 2 and rank == 2:
            os._exit(3)
        before = (outer.anchor.clone(), model.a.detach().clone(), model.stat.clone())
        try:
            outer.step()
        except Exception as e:  # noqa: BLE001 - the point of the test
            after = (outer.anchor, model.a.detach(), model.stat)
            return {"type": type(e).__name__, "message": str(e), "step": step,
                    "unchanged": all(torch.equal(x, y) for x, y in zip(before, after))}
    return None


def test_a_rank_that_dies_during_an_outer_sync_is_an_error_on_every_other_rank():
    with pytest.raises(RunFailed) as info:
        run_ranks(dying_worker, WORLD, backend="mccl", timeout=60, pg_timeout=20)
    results = info.value.results
    assert set(results) == {0, 1}, info.value
    for rank in (0, 1):
        got = results[rank]
        assert got is not None and got["type"] == "DistBackendError", got
        assert got["message"].startswith("DiLoCo: the outer sync of round 1 (started at inner step 2) failed; the "
                                         "anchor is unchanged: "), got["message"]
        assert "rank 2" in got["message"], got["message"]
        assert got["step"] == 4, got
        assert got["unchanged"], "the anchor, weights or buffers changed although the sync failed"


@pytest.mark.parametrize("setting,value,message", [
    ("sync_every", 0, "DiLoCo(sync_every=0): expected the inner steps per round, an int >= 1"),
    ("sync_every", 2.5, "DiLoCo(sync_every=2.5): expected the inner steps per round, an int >= 1"),
    ("sync_delay", 0, "DiLoCo(sync_delay=0): expected an int from 1 to sync_every=4"),
    ("sync_delay", 5, "DiLoCo(sync_delay=5): expected an int from 1 to sync_every=4"),
    ("outer_lr", 0.0, "DiLoCo(outer_lr=0.0): expected a number > 0"),
    ("outer_momentum", 1.0, "DiLoCo(outer_momentum=1.0): expected a number in [0, 1)"),
])
def test_bad_settings_are_named(setting, value, message):
    from lightning_mccl.diloco import DiLoCo

    kwargs = {"sync_every": 4, setting: value}
    with pytest.raises(ValueError) as info:
        DiLoCo(Toy(0), **kwargs)
    assert str(info.value).startswith(message), str(info.value)
