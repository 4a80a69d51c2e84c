"""DiLoCo's options for short jobs (diloco/schedule.py) on 3 CPU ranks (raw torch, tests/torch/harness.py),
against a float64 reference of the schedule written independently of the module from its documented rules:

- fragments: F contiguous parts of the parameters (the cuts below, worked out by hand), fragment f's sync
  starting after step round_start + ceil((f + 1) H / F), its outer step tau steps later (or just before its next
  sync), the buffers with the last fragment;
- the warm start: the first K steps each a round of one step whose outer step applies at once;
- the H schedule: at each round's start, H = sync_every while the learning rate is at or above its peak so far,
  else max(sync_every, floor((alpha / lr)^2)), at most the cap;

checked through what the ranks did: the anchor after every step (the same bits on every rank), each start's
slice of the vector that travels (every parameter and buffer exactly once a round), the outer group's
allreduce count after every step (`lightning_mccl.stats(group)`: one per fragment sync, and with the H
schedule one more per round, the ranks' check of their H), a DiLoCo rebuilt mid-round from `state_dict()`
(through torch.save) ending bit-identical to the uninterrupted run, and ranks whose learning rates give
different H stopping with the error that says so. The inner "optimizer" is a deterministic update per (step,
rank) that the reference replays; its learning rate is only what the H schedule reads.
"""
from __future__ import annotations

import io
import math
import zlib

import numpy as np
import pytest
import torch

from lightning_mccl.testing import run_ranks

WORLD = 3
SIZES = (5, 6, 4, 3)  # Toy's trainable parameters (a, b, c, d), 18 values; the buffer stat (3) follows them
# Each fragment's slice of the flat parameters, by hand: cuts at the tensor boundary nearest each k/F of 18 values
CUTS = {1: [(0, 18)], 2: [(0, 11), (11, 18)], 3: [(0, 5), (5, 11), (11, 18)], 4: [(0, 5), (5, 11), (11, 15), (15, 18)]}
# name: settings, outer step, inner steps, state_dict taken after step
CONFIGS = {
    "frag2": dict(sync_every=4, sync_delay=1, fragments=2, lr=1.0, mu=0.0, steps=13, taken=6),
    "frag2_end": dict(sync_every=4, sync_delay=2, fragments=2, lr=1.0, mu=0.0, steps=8, taken=8),  # then finish()
    "frag3_late": dict(sync_every=6, sync_delay=6, fragments=3, lr=0.7, mu=0.9, steps=17, taken=9),
    "frag4_short": dict(sync_every=2, sync_delay=1, fragments=4, lr=0.7, mu=0.5, steps=9, taken=5),
    "warm": dict(sync_every=3, sync_delay=2, warm_start=4, fragments=1, lr=1.0, mu=0.0, steps=12, taken=7),
    "warm_frag": dict(sync_every=4, sync_delay=1, warm_start=3, fragments=2, lr=0.7, mu=0.9, steps=11, taken=2),
    "qsr": dict(sync_every=2, sync_delay=2, warm_start=2, fragments=1, qsr_alpha=1.0, max_sync_every=8, lr=1.0,
                mu=0.0, steps=40, taken=23),
    "qsr_frag": dict(sync_every=2, sync_delay=1, fragments=2, qsr_alpha=1.0, max_sync_every=8, lr=0.7, mu=0.9,
                     steps=40, taken=20),
    # three fragments in flight together through the averagings that keep a buffer (16-bit cast) or a residual
    # (8-bit) per fragment; taken with all three in flight
    "late_cast": dict(sync_every=6, sync_delay=6, fragments=3, lr=1.0, mu=0.0, steps=17, taken=9, wire="cast"),
    "late_int8": dict(sync_every=6, sync_delay=6, fragments=3, lr=1.0, mu=0.0, steps=17, taken=9, wire="int8"),
    # fragments="auto": min(H, Toy's 4 tensors), `parts` by hand: H = 2 gives 2 (a fragment a step); H = 6 gives 4
    # (a fragment a tensor, starting after steps 2, 3, 5 and 6 of a round)
    "auto_h2": dict(sync_every=2, sync_delay=1, fragments="auto", parts=2, lr=0.7, mu=0.9, steps=9, taken=5),
    "auto_h6": dict(sync_every=6, sync_delay=2, fragments="auto", parts=4, lr=1.0, mu=0.0, steps=15, taken=8),
    # the whole model (a checkpoint of the releases before "auto", or of fragments=1) resumed with
    # fragments="auto" (`resume`), taken with its sync in flight: the checkpoint's one fragment is taken
    "whole_to_auto": dict(sync_every=4, sync_delay=2, fragments=1, lr=0.7, mu=0.9, steps=13, taken=5,
                          resume="auto"),
}
# their error bound against the float32 reference, per value of each sync's mean, in units of max|delta|: a bf16
# sum of 3 (each contribution and partial sum rounded once: 3 u with u = 2^-8); an 8-bit value and its residual
# (3 / 126, as test_diloco.py's)
WIRE_BOUND = {"cast": 3 * 2.0**-8, "int8": 3 / 126}
OPTIONS = ("sync_delay", "warm_start", "fragments", "qsr_alpha", "max_sync_every")


def parts(c) -> int:
    """A config's number of fragments (its "auto" worked out by hand: `parts`)."""
    return c.get("parts", c["fragments"])


def learning_rate(step: int, rank: int = 0, disagree: bool = False) -> float:
    """The inner optimizer's learning rate at step `step`: rising to 1 (a warm-up), falling to 0.3, then up again
    (so that H shrinks); with `disagree`, rank 1's falls twice as fast."""
    if step <= 4:
        return 0.25 * step
    if step <= 16:
        return (1.0 - 0.06 * (step - 4)) * (0.5 if disagree and rank == 1 else 1.0)
    return 0.7


class Toy(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        for name, shape in zip("abcd", ((5,), (2, 3), (4,), (3,))):  # SIZES
            self.register_parameter(name, torch.nn.Parameter(torch.randn(shape, generator=g)))
        self.register_buffer("stat", torch.randn(3, generator=g))

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in (self.a, self.b, self.c, self.d)])


def inner_update(name: str, step: int, rank: int):
    """What rank `rank`'s inner step `step` adds to the 18 parameter values, and the value it mixes into stat."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{step}/{rank}".encode()))
    return 0.1 * torch.randn(18, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)


def max_delta(name):
    """The largest value a rank's pseudo-gradient can reach: every rank's updates over the longest stretch between
    two syncs of a value (two rounds), and the buffer's values."""
    c = CONFIGS[name]
    span = 2 * c.get("max_sync_every") if "max_sync_every" in c else 2 * c["sync_every"]
    return max(float(sum(inner_update(name, s, r)[0].abs() for s in range(k, k + span)).max())
               for r in range(WORLD) for k in range(1, c["steps"] + 1)) + 4.0


def make(name, model, group, log, steps_of, resumed=False):
    from lightning_mccl.diloco import AllreduceMean, CastMean, DiLoCo, Int8Mean

    class Recording:  # every start: (inner step, fragment, offset in the vector, values); the rest is `inner`'s
        def __init__(self, inner):
            self.inner = inner

        def start(self, flat, part=0):
            log.append((steps_of(), part, flat.storage_offset(), flat.numel()))
            return self.inner.start(flat, part)

        def __getattr__(self, attribute):
            return getattr(self.inner, attribute)

    c = CONFIGS[name]
    options = {k: c[k] for k in OPTIONS if k in c}
    if resumed and "resume" in c:
        options["fragments"] = c["resume"]
    inner = {"cast": lambda: CastMean(torch.bfloat16, group), "int8": lambda: Int8Mean(group)}.get(
        c.get("wire"), lambda: AllreduceMean(group))()
    return DiLoCo(model, c["sync_every"], outer_lr=c["lr"], outer_momentum=c["mu"], averaging=Recording(inner),
                  **options)


def train(name, model, outer, opt, first, last, rank, group, disagree=False):
    """Steps first..last: the inner update, then opt.step() (its post-hook runs outer.step()); the anchor and the
    outer group's allreduce count after each (the engine counts an allreduce as it runs: read after state_dict(),
    which waits for the syncs in flight and changes nothing else)."""
    import lightning_mccl

    anchors, counts = [], []
    for step in range(first, last + 1):
        update, stat = inner_update(name, step, rank)
        opt.param_groups[0]["lr"] = learning_rate(step, rank, disagree)
        with torch.no_grad():
            for p, u in zip((model.a, model.b, model.c, model.d), torch.split(update.float(), SIZES)):
                p.add_(u.view(p.shape))
            model.stat.mul_(0.5).add_(stat.float(), alpha=0.5)
        opt.step()
        outer.state_dict()
        anchors.append(outer.anchor.clone())
        counts.append(lightning_mccl.stats(group)["kinds"].get("allreduce", {}).get("calls", 0))
    return anchors, counts


def schedule_worker(rank, world):
    import torch.distributed as dist

    from lightning_mccl.diloco import outer_group

    out = {}
    for name, c in CONFIGS.items():
        group = outer_group()
        model, log = Toy(seed=rank), []
        outer = make(name, model, group, log, lambda: outer.inner_steps)
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=learning_rate(1))
        outer.broadcast()
        outer.attach(opt)
        anchors, counts = train(name, model, outer, opt, 1, c["taken"], rank, group)
        buffer = io.BytesIO()
        torch.save(outer.state_dict(), buffer)
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        more, more_counts = train(name, model, outer, opt, c["taken"] + 1, c["steps"], rank, group)
        trained = len(log)
        outer.finish()
        twin, twin_log = Toy(seed=100 + rank), []
        twin.load_state_dict(weights)
        again = make(name, twin, group, twin_log, lambda: again.inner_steps, resumed=True)
        again.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=False))
        twin_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=learning_rate(c["taken"]))
        again.attach(twin_opt)
        train(name, twin, again, twin_opt, c["taken"] + 1, c["steps"], rank, group)
        again.finish()
        out[name] = {"anchors": torch.stack(anchors + more), "counts": counts + more_counts, "log": log[:trained],
                     "finish_log": log[trained:],
                     "final": model.flat(), "stat": model.stat.clone(), "final_anchor": outer.anchor.clone(),
                     "resumed": twin.flat(), "resumed_stat": twin.stat.clone(), "rounds": outer.rounds,
                     "fragments": (outer.fragments, again.fragments)}
        dist.destroy_process_group(group)
    # two fragments' averagings in flight together, of the same size: each keeps its own 16-bit buffer, and the
    # 8-bit path its own residual
    from lightning_mccl.diloco import CastMean, Int8Mean

    group = outer_group()
    first, second = torch.full((4,), rank + 1.0), torch.full((4,), 10.0 * (rank + 1))
    cast = CastMean(torch.bfloat16, group)
    flights = [cast.start(first, 0), cast.start(second, 1)]
    for flight in flights:
        flight.wait()
    int8 = Int8Mean(group)
    flights = [int8.start(torch.full((5,), 0.3 + rank), 0), int8.start(torch.full((7,), 0.7 * rank), 1)]
    for flight in flights:
        flight.wait()
    out["parts"] = {"cast": (first.clone(), second.clone()),
                    "residuals": {k: v.numel() for k, v in int8.state_dict().items()}}
    dist.destroy_process_group(group)
    # ranks whose learning rates give different H: an error on every rank, before any sync of that round
    group = outer_group()
    model, log = Toy(seed=rank), []
    outer = make("qsr_frag", model, group, log, lambda: outer.inner_steps)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=learning_rate(1))
    outer.broadcast()
    outer.attach(opt)
    try:
        train("qsr_frag", model, outer, opt, 1, 20, rank, group, disagree=True)
        out["disagree"] = None
    except ValueError as e:
        out["disagree"] = {"message": str(e), "step": outer.inner_steps, "starts": len(log)}
    dist.destroy_process_group(group)
    return out


def reference(name):
    """float64: the anchor after every step, the final weights and stat, the ends of the whole rounds (the inner
    steps after which they ended), the fragments finish() syncs (those with steps since their last sync), and the
    outer group's allreduce count after every step."""
    c = CONFIGS[name]
    H, tau, F = c["sync_every"], c["sync_delay"], parts(c)
    K, alpha, cap = c.get("warm_start", 0), c.get("qsr_alpha"), c.get("max_sync_every")
    cuts = CUTS[F]
    start = Toy(seed=0)
    anchor = start.flat().double()
    w = [anchor.clone() for _ in range(WORLD)]
    stat = [start.stat.double().clone() for _ in range(WORLD)]
    m = torch.zeros_like(anchor)
    pending = [None] * F  # (applies at, weights at the start, mean, stat mean)
    last_start = [0] * F
    state = {"round_start": 0, "length": None, "peak": None, "calls": 0, "ends": []}
    anchors, counts = [], []

    def length_of(s, lr):
        if s < K:
            return 1
        if alpha is None:
            return H
        state["calls"] += 1  # the ranks' check of their H
        if state["peak"] is None or lr >= state["peak"]:
            state["peak"] = lr
            return H
        return min(cap, max(H, math.floor((alpha / lr) ** 2)))

    def begin(s, lr):
        state["round_start"], state["length"] = s, length_of(s, lr)

    def start_sync(f, step):
        lo, hi = cuts[f]
        mean = sum(anchor[lo:hi] - x[lo:hi] for x in w) / WORLD
        stat_mean = sum(stat) / WORLD if f == F - 1 else None
        delay = 0 if state["round_start"] < K else tau
        pending[f] = (step + delay, [x.clone() for x in w], mean, stat_mean)
        last_start[f] = step
        state["calls"] += 1

    def apply(f):
        nonlocal anchor
        _, at_start, mean, stat_mean = pending[f]
        lo, hi = cuts[f]
        m[lo:hi] = c["mu"] * m[lo:hi] + mean
        anchor = anchor.clone()
        anchor[lo:hi] -= c["lr"] * (mean + c["mu"] * m[lo:hi])
        for i in range(WORLD):
            w[i][lo:hi] = anchor[lo:hi] + (w[i][lo:hi] - at_start[i][lo:hi])
            if stat_mean is not None:
                stat[i] = stat_mean.clone()
        pending[f] = None

    for step in range(1, c["steps"] + 1):
        if state["length"] is None:
            begin(0, learning_rate(1))
        for i in range(WORLD):
            update, new = inner_update(name, step, i)
            w[i] = w[i] + update
            stat[i] = 0.5 * stat[i] + 0.5 * new
        for f in range(F):
            if pending[f] is not None and pending[f][0] == step:
                apply(f)
        for f in range(F):
            if step == state["round_start"] + math.ceil((f + 1) * state["length"] / F):
                if pending[f] is not None:
                    apply(f)
                start_sync(f, step)
        for f in range(F):
            if pending[f] is not None and pending[f][0] == step:
                apply(f)
        if step == state["round_start"] + state["length"]:
            state["ends"].append(step)
            begin(step, learning_rate(step))
        anchors.append(anchor.clone())
        counts.append(state["calls"])
    for f in range(F):
        if pending[f] is not None:
            apply(f)
    unsynced = [f for f in range(F) if c["steps"] > last_start[f]]
    for f in unsynced:
        start_sync(f, c["steps"])
    for f in unsynced:
        apply(f)
    return torch.stack(anchors), anchor, stat[0], state["ends"], unsynced, counts


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(schedule_worker, WORLD, backend="mccl", timeout=180)  # stats() reads mccl groups


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_anchor_follows_the_float64_schedule_and_is_the_same_on_every_rank(ranks, name):
    anchors, final, stat, ends, partial, _ = reference(name)
    rank0 = ranks[0][name]
    for r in range(WORLD):
        got = ranks[r][name]
        assert np.array_equal(got["anchors"], rank0["anchors"]), f"rank {r}'s anchor differs from rank 0's"
        assert np.array_equal(got["final"], rank0["final"]) and np.array_equal(got["stat"], rank0["stat"])
    wire = CONFIGS[name].get("wire")
    # 16-bit and 8-bit means: within their bound per sync (plain averaging: the errors of a value's syncs add up)
    atol = 1e-6 if wire is None else WIRE_BOUND[wire] * max_delta(name) * (len(ends) + 1)
    np.testing.assert_allclose(rank0["anchors"], anchors.numpy(), rtol=1e-5, atol=atol)
    assert np.array_equal(rank0["final"], rank0["final_anchor"]), "finish() did not leave the anchor in the weights"
    np.testing.assert_allclose(rank0["final"], final.numpy(), rtol=1e-5, atol=atol)
    np.testing.assert_allclose(rank0["stat"], stat.numpy(), rtol=1e-5, atol=1e-6 if wire is None else atol)
    if wire is not None:
        assert np.abs(rank0["anchors"] - anchors.numpy()).max() > 0, "the narrow wire changed nothing"
    assert rank0["rounds"] == len(ends) + bool(partial), (rank0["rounds"], ends, partial)
    moved = np.abs(np.diff(rank0["anchors"], axis=0)).max()
    assert moved > 0.01, "the anchor hardly moved: the schedule was not exercised"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_parameter_and_buffer_syncs_exactly_once_a_round(ranks, name):
    """Each whole round's starts (between its boundaries, the reference's) carry slices of the vector that cover
    the 18 parameter values and the 3 of the buffer exactly once; with fragments each start carries its own cut;
    finish() syncs the fragments with steps since their last sync."""
    _, _, _, ends, unsynced, _ = reference(name)
    fragments = parts(CONFIGS[name])
    log = ranks[0][name]["log"]
    assert [entry for r in range(WORLD) for entry in ranks[r][name]["log"]] == log * WORLD, "the ranks' starts differ"
    for f, offset, numel in {(f, o, n) for _, f, o, n in log}:
        lo, hi = CUTS[fragments][f]
        assert (offset, offset + numel) == (lo, hi + (3 if f == fragments - 1 else 0)), (f, offset, numel)
    begin = 0
    for end in ends:
        covered = np.zeros(21, dtype=int)
        for step, _, offset, numel in log:
            if begin < step <= end:
                covered[offset:offset + numel] += 1
        assert (covered == 1).all(), f"round ({begin}, {end}]: values synced {covered.tolist()} times"
        begin = end
    assert len(ends) >= 2
    assert [f for _, f, _, _ in ranks[0][name]["finish_log"]] == unsynced


@pytest.mark.parametrize("name", ["warm", "warm_frag", "qsr", "qsr_frag", "frag2", "auto_h2", "auto_h6"])
def test_the_outer_group_runs_one_allreduce_per_fragment_sync_and_one_check_per_scheduled_round(ranks, name):
    """After every step, the outer group's allreduce count (lightning_mccl.stats(group)) is the reference's: in
    the warm start one per fragment every step, then one per fragment a round, plus, with the H schedule, the
    ranks' check of each round's H. The H schedule's rounds grow as the learning rate falls and shrink when it
    rises."""
    _, _, _, ends, _, counts = reference(name)
    for r in range(WORLD):
        got = ranks[r][name]["counts"]
        assert got == counts, (r, got, counts)
    c = CONFIGS[name]
    if c["fragments"] == "auto":  # by each round's end, one allreduce per fragment a round
        assert [counts[end - 1] for end in ends] == [parts(c) * (i + 1) for i in range(len(ends))], (ends, counts)
    lengths = np.diff([0] + ends).tolist()  # of the whole rounds
    if "warm_start" in c:
        assert lengths[:c["warm_start"]] == [1] * c["warm_start"]
        per_step, check = parts(c), "qsr_alpha" in c  # the first scheduled round's check at its end
        assert counts[:c["warm_start"]] == [per_step * s + check * (s == c["warm_start"])
                                            for s in range(1, c["warm_start"] + 1)]
    if "qsr_alpha" in c:
        assert max(lengths) == c["max_sync_every"] and min(lengths[c.get("warm_start", 0):]) == c["sync_every"]
        peak = lengths.index(max(lengths))
        assert any(b < a for a, b in zip(lengths[peak:], lengths[peak + 1:])), f"H never shrank: {lengths}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_resuming_mid_round_equals_the_uninterrupted_run(ranks, name):
    """state_dict() after step `taken`: fragments in flight (frag2, frag3_late, qsr_frag), in the warm start
    (warm_frag), in a scheduled round (qsr), at a round's end with only finish() to come (frag2_end: it syncs
    the fragments with steps since their last sync)."""
    for r in range(WORLD):
        got = ranks[r][name]
        assert got["fragments"] == (parts(CONFIGS[name]),) * 2, (r, got["fragments"])
        assert np.array_equal(got["resumed"], got["final"]), f"rank {r}: the resumed run's weights differ"
        assert np.array_equal(got["resumed_stat"], got["stat"]), f"rank {r}: the resumed run's buffer differs"


def test_ranks_whose_learning_rates_give_different_H_stop_with_an_error_on_every_rank(ranks):
    messages = [ranks[r]["disagree"] for r in range(WORLD)]
    assert all(m is not None for m in messages), messages
    for r, m in enumerate(messages):
        assert m["message"].startswith("DiLoCo(qsr_alpha=1.0): the ranks chose different H for round "), m
        assert "the H schedule needs the same learning rate on every rank" in m["message"], m
    assert len({(m["step"], m["starts"]) for m in messages}) == 1, messages


@pytest.mark.parametrize("kwargs,message", [
    (dict(warm_start=-1), "DiLoCo(warm_start=-1): expected the synchronous inner steps at the start, an int >= 0"),
    (dict(warm_start=1.5), "DiLoCo(warm_start=1.5): expected the synchronous inner steps at the start"),
    (dict(fragments=0), "DiLoCo(fragments=0): expected the number of parts the parameters sync in, an int >= 1"),
    (dict(fragments=5), "DiLoCo(fragments=5): the model has 4 trainable parameter tensors, and each fragment is "
                        "one or more of them"),
    (dict(fragments="Auto"), "DiLoCo(fragments='Auto'): expected the number of parts the parameters sync in, an "
                             "int >= 1, or 'auto' (min(sync_every, the trainable parameter tensors))"),
    (dict(fragments=1.5), "DiLoCo(fragments=1.5): expected the number of parts the parameters sync in"),
    (dict(fragments=True), "DiLoCo(fragments=True): expected the number of parts the parameters sync in"),
    (dict(qsr_alpha=0.0, max_sync_every=8), "DiLoCo(qsr_alpha=0.0): expected a number > 0"),
    (dict(qsr_alpha=0.01), "DiLoCo(qsr_alpha=0.01): the H schedule needs a cap, max_sync_every (an int >= "
                           "sync_every=4)"),
    (dict(qsr_alpha=0.01, max_sync_every=3), "DiLoCo(max_sync_every=3): expected an int >= sync_every=4"),
    (dict(max_sync_every=8), "DiLoCo(max_sync_every=8): caps the H schedule, which is off; give qsr_alpha too"),
])
def test_bad_settings_are_named(kwargs, message):
    from lightning_mccl.diloco import DiLoCo

    with pytest.raises(ValueError) as info:
        DiLoCo(Toy(0), 4, **kwargs)
    assert str(info.value).startswith(message), str(info.value)


def test_the_h_schedule_without_an_optimizer_and_a_checkpoint_of_other_settings_are_named():
    """In one process, with no process group: the H schedule's first round needs the learning rate; a state of
    other settings is refused naming them."""
    from lightning_mccl.diloco import AllreduceMean, DiLoCo

    outer = DiLoCo(Toy(0), 4, qsr_alpha=0.01, max_sync_every=8, averaging=AllreduceMean())
    with pytest.raises(ValueError, match=r"^DiLoCo\(qsr_alpha=0.01\): the H schedule reads the inner optimizer's "
                                         r"learning rate: give the optimizer to attach\(\) first"):
        outer.step()
    state = DiLoCo(Toy(0), 4, fragments=2).state_dict()
    with pytest.raises(ValueError, match=r"^DiLoCo: the checkpoint's DiLoCo ran with fragments=2, this run has "
                                         r"fragments=3: resume with the same settings \(fragments=2, or 'auto', "
                                         r"which takes the checkpoint's\)$"):
        DiLoCo(Toy(0), 4, fragments=3).load_state_dict(state)
    with pytest.raises(ValueError, match=r"^DiLoCo: the checkpoint's DiLoCo ran with sync_every=4, this run has "
                                         r"sync_every=2: resume with the same settings$"):
        DiLoCo(Toy(0), 2).load_state_dict(state)  # "auto" takes the count, not the other settings


class Tensors(torch.nn.Module):
    """`n` trainable parameter tensors of 3 values each, and a frozen one."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(3)) for _ in range(n))
        self.frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)


def test_auto_fragments_are_h_or_the_trainable_tensors_whichever_is_fewer_and_a_checkpoint_s_when_resuming():
    """fragments="auto" (the default) is min(sync_every, the trainable parameter tensors) (the runs on 3 ranks
    above count their allreduces); resuming, it takes the checkpoint's count, which an explicit one must match."""
    from lightning_mccl.diloco import DiLoCo
    from lightning_mccl.diloco.settings import FRAGMENTS, resolve_fragments

    assert FRAGMENTS == "auto"
    assert [DiLoCo(Tensors(n), 4).fragments for n in (1, 2, 4, 10)] == [1, 2, 4, 4]
    assert [DiLoCo(Tensors(10), h).fragments for h in (1, 3, 12)] == [1, 3, 10]
    assert DiLoCo(Tensors(10), 4, fragments=1).fragments == 1
    assert DiLoCo(Tensors(10), 2, qsr_alpha=1.0, max_sync_every=8).fragments == 2  # the base H
    assert resolve_fragments("auto", 4, 0) == 1 and resolve_fragments(3, 4, 10) == 3
    with pytest.raises(ValueError, match=r"^DiLoCo\(fragments=1\): the model has 0 trainable parameter tensors"):
        DiLoCo(Tensors(0), 4)
    for saved in (1, 2):
        state = DiLoCo(Tensors(10), 4, fragments=saved).state_dict()
        resumed = DiLoCo(Tensors(10), 4)
        resumed.load_state_dict(state)
        assert (resumed.fragments, len(resumed.outer_optimizers)) == (saved, saved)
        assert resumed.schedule.settings() == DiLoCo(Tensors(10), 4, fragments=saved).schedule.settings()


def test_fragments_are_contiguous_and_balanced():
    from lightning_mccl.diloco.schedule import fragment_bounds, offsets, qsr_length

    assert [fragment_bounds(SIZES, f) for f in (1, 2, 3, 4)] == [[0, 4], [0, 2, 4], [0, 1, 2, 4], [0, 1, 2, 3, 4]]
    assert fragment_bounds([100, 1, 1, 1], 3) == [0, 1, 2, 4]  # each part at least one tensor
    assert fragment_bounds([1] * 12, 4) == [0, 3, 6, 9, 12]
    assert offsets(4, 1) == [4] and offsets(8, 4) == [2, 4, 6, 8] and offsets(6, 4) == [2, 3, 5, 6]
    assert offsets(1, 3) == [1, 1, 1]  # a round shorter than F: fragments share steps
    assert [qsr_length(2, 1.0, lr, 8) for lr in (2.0, 0.5, 0.4, 0.2, 0.0)] == [2, 4, 6, 8, 8]


def test_the_averagings_keep_a_buffer_and_a_residual_per_fragment(ranks):
    for r in range(WORLD):
        first, second = ranks[r]["parts"]["cast"]
        assert (first == 2.0).all() and (second == 20.0).all(), (r, first, second)
        assert ranks[r]["parts"]["residuals"] == {("diloco", 0): 5, ("diloco", 1): 7}
