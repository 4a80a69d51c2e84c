"""mccl plan's model against hand-computed cases, without torch: the ring's bytes and the algorithm's steps,
DDP's buckets, the bucket schedule over the backward pass (one bucket, many, link-bound, compute-bound), each
method's bytes and device work, DiLoCo's rounds, and the plan's efficiency and speed-up."""
from __future__ import annotations

import math
import os

import pytest
import yaml

from lightning_mccl.plan.buckets import MIB, assign, buckets
from lightning_mccl.plan.link import Link, algorithm_steps, ring_bytes
from lightning_mccl.plan.methods import BF16, DDP, DiLoCo, Int8, PowerSGD, int8_bytes, powersgd_matrix
from lightning_mccl.plan.predict import Settings, build_methods, predict
from lightning_mccl.plan.profile import Kernels, Param, PowerSGDCost, Profile
from lightning_mccl.plan.schedule import Chain, Collective, bucketed_step

GB = 1e9  # a link of 1 GB/s: a byte is a nanosecond
BARE = Link(GB, op_latency_s=0.0, step_latency_s=0.0, hook_latency_s=0.0)


def profile(params, forward=0.1, backward=0.3, step=0.31, kernels=Kernels(), batch=8) -> Profile:
    return Profile(model="test", model_args={}, batch=batch, device="cpu", device_name="test", share_device=1,
                   steps=1, warmup=1, optimizer="SGD", forward_s=forward, backward_s=backward, step_s=step,
                   params=tuple(params), kernels=kernels)


def p(name, numel, ready, shape=None):
    return Param(name, tuple(shape or (numel,)), 4, ready)


# -- the link ---------------------------------------------------------------------------------------------

def test_ring_bytes_are_2_n_minus_1_over_n_of_the_payload():
    assert ring_bytes(800, 2) == 800
    assert ring_bytes(800, 4) == 1200
    assert ring_bytes(800, 8) == 1400
    assert ring_bytes(800, 1) == 0


def test_large_messages_take_the_ring_small_ones_recursive_doubling_as_the_engine_chooses():
    assert algorithm_steps(4 * MIB, 8) == (14, 2 * 7 / 8 * 4 * MIB)
    assert algorithm_steps(128 << 10, 8) == (3, 3 * (128 << 10))  # at the threshold for 8 ranks
    assert algorithm_steps((128 << 10) + 1, 8)[0] == 14
    assert algorithm_steps(1 << 10, 6) == (4, 4 << 10)  # 2 steps and the fold's 2
    assert algorithm_steps(1 << 20, 48) == (5 + 2, 7 << 20)  # 1 MiB above 16 ranks
    assert algorithm_steps(100, 1) == (0, 0.0)


def test_an_allreduce_costs_its_latency_steps_and_ring_bytes_at_the_goodput():
    link = Link(GB, op_latency_s=100e-6, step_latency_s=10e-6, hook_latency_s=50e-6)
    # 8 MB on 4 hosts: 6 ring steps, 12 MB on each link
    assert link.allreduce_s(8e6, 4) == pytest.approx(100e-6 + 6 * 10e-6 + 12e-3)
    assert link.allreduce_s(8e6, 4, hook=True) == pytest.approx(150e-6 + 6 * 10e-6 + 12e-3)
    assert link.allreduce_s(8e6, 4, rate_Bps=0.5e9) == pytest.approx(160e-6 + 24e-3)  # a slower codec
    assert link.allreduce_s(8e6, 1) == 0.0
    with pytest.raises(ValueError, match="goodput must be positive"):
        Link(0.0)


# -- DDP's buckets ----------------------------------------------------------------------------------------

def test_buckets_close_at_the_limit_the_first_at_its_own():
    mb = 1 << 20
    # ready order; (bytes, dtype): a bucket holds at least its limit, the last parameter may overshoot
    sizes = [(mb // 2, 4), (mb, 4), (3 * mb, 4), (4 * mb, 4), (mb, 4), (9 * mb, 4), (mb // 4, 4)]
    assert assign(sizes, 5 * mb, 1 * mb) == [[0, 1], [2, 3], [4, 5], [6]]
    assert assign(sizes, 5 * mb, 5 * mb) == [[0, 1, 2, 3], [4, 5], [6]]  # 4.5 MB is not yet 5
    # another dtype fills its own buckets, each with its own first limit
    assert assign([(mb, 4), (mb, 2), (mb, 4), (mb, 2)], 2 * mb, 2 * mb) == [[0, 2], [1, 3]]


def test_bucket_assignment_equals_torchs():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    numels = [1000, 300_000, 10, 2_000_000, 5, 400_000, 3_000_000, 7, 262_144, 262_144, 1]
    tensors = [torch.empty(n) for n in numels]
    ready_order = list(reversed(range(len(numels))))  # as backward produces them: the last first
    for limits in ([1 << 20, 5 << 20], [5 << 20, 5 << 20], [1 << 20, 25 << 20]):
        want, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in ready_order], limits,
                                                          [False] * len(numels), ready_order)
        got = assign([(4 * numels[i], 4) for i in ready_order], limits[1], limits[0])
        assert [[ready_order[i] for i in b] for b in got] == want


def test_a_bucket_is_launched_when_its_last_gradient_is_ready_and_not_before_the_one_before_it():
    params = [p("a", MIB // 4, 0.10), p("b", MIB // 4, 0.12), p("c", MIB // 4, 0.11), p("d", 10, 0.20)]
    got = buckets(params, 2 * MIB, 1 * MIB)
    assert [[x.name for x in b.params] for b in got] == [["a"], ["b", "c"], ["d"]]
    assert [b.ready_s for b in got] == [0.10, 0.12, 0.20]
    got = buckets(params, 1 * MIB // 4, 1 * MIB // 4)  # one parameter per bucket
    assert [b.ready_s for b in got] == [0.10, 0.12, 0.12, 0.20]  # c waits for b, launched first
    assert got[0].nbytes == MIB and got[3].numel == 10


# -- the schedule ---------------------------------------------------------------------------------------

def test_one_bucket_ready_at_the_end_of_backward_is_all_exposed():
    step = bucketed_step([Chain(0.3, (Collective(50e6),))], backward_s=0.3, optimizer_s=0.01, n=2, link=BARE)
    # 2 hosts: the ring sends the 50 MB once: 50 ms after the backward pass, then the optimizer
    assert step.step_s == pytest.approx(0.3 + 0.05 + 0.01)
    assert step.comm_s == pytest.approx(0.05)


def test_compute_bound_buckets_hide_behind_the_backward_pass_but_the_last():
    # 4 hosts, 1 MB buckets: 1.5 ms each on the link, ready every 50 ms: only the last one is exposed
    chains = [Chain(0.1 + 0.05 * k, (Collective(1e6),)) for k in range(5)]
    step = bucketed_step(chains, backward_s=0.3, optimizer_s=0.01, n=4, link=BARE)
    assert step.step_s == pytest.approx(0.3 + 0.0015 + 0.01)
    assert step.last_done_s == pytest.approx(0.3015)


def test_link_bound_buckets_queue_behind_each_other_from_the_first_one():
    # 8 hosts, 40 MB buckets: 70 ms each (2 x 7/8 x 40 MB at 1 GB/s), ready every 10 ms from 100 ms
    chains = [Chain(0.1 + 0.01 * k, (Collective(40e6),)) for k in range(5)]
    step = bucketed_step(chains, backward_s=0.14, optimizer_s=0.005, n=8, link=BARE)
    assert step.step_s == pytest.approx(0.1 + 5 * 0.07 + 0.005)
    assert step.comm_s == pytest.approx(0.35)


def test_overlap_a_bucket_starts_when_it_is_ready_and_the_previous_one_is_done():
    link = Link(GB, op_latency_s=1e-3, step_latency_s=0.0, hook_latency_s=0.0)
    # 2 hosts: 10 MB = 10 ms + 1 ms; ready at 0.10, 0.105 (waits for the first: 0.111), 0.150 (starts then)
    chains = [Chain(0.100, (Collective(10e6),)), Chain(0.105, (Collective(10e6),)), Chain(0.150, (Collective(10e6),))]
    step = bucketed_step(chains, backward_s=0.155, optimizer_s=0.002, n=2, link=link)
    assert step.last_done_s == pytest.approx(0.161)
    assert step.step_s == pytest.approx(0.163)


def test_device_work_issued_with_a_bucket_delays_it_and_the_backward_pass_after_it_is_queued():
    chains = [Chain(0.1, (Collective(1e6),), issued_s=0.002, after_s=0.003),
              Chain(0.2, (Collective(1e6), Collective(1e6, before_s=0.004)), issued_s=0.001, after_s=0.005)]
    step = bucketed_step(chains, backward_s=0.2, optimizer_s=0.0, n=2, link=BARE)
    assert step.backward_end_s == pytest.approx(0.203)
    # chain 1: starts 0.102, done 0.103; its 3 ms after the backward pass (0.203 -> 0.206)
    # chain 2: ready 0.203, first done 0.204, then 4 ms of device work behind 0.206: 0.210, done 0.211,
    # then 5 ms: 0.216
    assert step.last_done_s == pytest.approx(0.211)
    assert step.step_s == pytest.approx(0.216)


# -- the methods' bytes and work -----------------------------------------------------------------------

def model_params():
    # backward order: head (1000 x 100), a bias, a 400 x 100 matrix, a 5 x 20 one (not worth compressing at
    # rank 2: (5 + 20) x 2 x 2 is not less than 100)
    return [p("head", 100_000, 0.15, (1000, 100)), p("bias", 100, 0.16), p("w", 40_000, 0.2, (400, 100)),
            p("small", 100, 0.25, (5, 20))]


def test_each_bucketed_method_sends_its_bytes():
    prof = profile(model_params(), kernels=Kernels(bf16_encode=1e-9, bf16_decode=2e-9))
    (bucket,) = DDP(1000).buckets(prof)
    numel = 140_200
    assert bucket.nbytes == 4 * numel
    assert DDP(1000).chain(bucket, prof).collectives[0].nbytes == 4 * numel
    c = BF16(1000).chain(bucket, prof)
    assert (c.collectives[0].nbytes, c.issued_s, c.after_s, c.hook) == (2 * numel, pytest.approx(4 * numel * 1e-9),
                                                                        pytest.approx(4 * numel * 2e-9), True)
    # int8: a code per value and a float32 scale per 256, by the exchange
    c = Int8(1000, codec_Bps=5e8).chain(bucket, prof)
    assert c.collectives[0].nbytes == numel + math.ceil(numel / 256) * 4 == int8_bytes(numel)
    assert (c.collectives[0].rate_Bps, c.collectives[0].exchange, c.issued_s, c.after_s, c.hook) == (
        5e8, True, 0.0, 0.0, True)


def test_the_8_bit_exchange_takes_two_steps_whatever_the_size_at_its_measured_share_of_the_link():
    link = Link(GB, op_latency_s=0.0, step_latency_s=10e-6, hook_latency_s=0.0)
    assert link.allreduce_s(8e6, 8, exchange=True) == pytest.approx(2 * 10e-6 + 14e6 / (0.70 * GB))
    assert link.allreduce_s(1e3, 8, exchange=True) == pytest.approx(2 * 10e-6 + 1.75e3 / (0.70 * GB))
    assert link.allreduce_s(8e6, 4, exchange=True) == pytest.approx(2 * 10e-6 + 12e6 / (0.89 * GB))
    assert link.allreduce_s(8e6, 24, exchange=True) == pytest.approx(2 * 10e-6 + 2 * 23 / 24 * 8e6 / (0.70 * GB))
    # a codec slower than that sets the rate
    assert link.allreduce_s(8e6, 8, rate_Bps=0.5 * GB, exchange=True) == pytest.approx(2 * 10e-6 + 14e6 / (0.5 * GB))


def test_powersgd_sends_the_uncompressed_tensors_then_p_then_q():
    assert powersgd_matrix(Param("m", (1000, 3, 4, 4), 4, 0), 4) == (1000, 48, 4)
    assert powersgd_matrix(Param("tiny", (10, 10), 4, 0), 4) is None  # 20 x 4 x 2 >= 100
    assert powersgd_matrix(Param("row", (1, 5000), 4, 0), 1) is None  # (1 + 5000) x 2 >= 5000
    assert powersgd_matrix(Param("bias", (7,), 4, 0), 1) is None
    prof = profile(model_params(), kernels=Kernels(powersgd={2: PowerSGDCost(0.010, 0.020, 0.030)}))
    (bucket,) = PowerSGD(2, 1000).buckets(prof)
    c = PowerSGD(2, 1000).chain(bucket, prof)
    plain, ps, qs = (x.nbytes for x in c.collectives)
    assert plain == 4 * (100 + 100)  # the bias and the small matrix
    assert ps == 4 * 2 * (1000 + 400)  # P: rows x rank
    assert qs == 4 * 2 * (100 + 100)  # Q: cols x rank
    assert (c.issued_s, c.collectives[2].before_s, c.after_s) == (0.010, 0.020, 0.030)
    # in two buckets the matrix work splits by the matrices' elements: head 100k of 140k
    first, second = PowerSGD(2, 0.3).buckets(prof)
    assert [x.name for x in first.params] == ["head"]
    assert PowerSGD(2, 0.3).chain(first, prof).issued_s == pytest.approx(0.010 * 100 / 140)
    with pytest.raises(ValueError, match="at ranks \\[2\\], not at rank 4: profile again with --powersgd-ranks 4"):
        PowerSGD(4, 1000).chain(bucket, prof)


def test_diloco_hides_its_allreduce_behind_tau_steps_or_waits_for_it():
    prof = profile([p("w", 25_000_000, 0.2)], step=0.31, kernels=Kernels(pseudo_gradient=1e-12, outer_step=2e-12))
    # 8 hosts, float32: 100 MB, 175 ms on the ring, hidden behind one step of 310 ms; a round of 2 steps
    t = DiLoCo(2, wire="float32").timing(prof, 8, BARE)
    assert t.step_s == pytest.approx((2 * 0.31 + 100e6 * 3e-12) / 2)
    assert t.comm_s == pytest.approx(0.175 / 2)
    # one inner step of 10 ms: the round waits for what the tau steps did not hide
    fast = profile([p("w", 25_000_000, 0.005)], forward=0.002, backward=0.008, step=0.01)
    assert DiLoCo(4, wire="float32").timing(fast, 8, BARE).step_s == pytest.approx((0.04 + 0.175 - 0.01) / 4)
    assert DiLoCo(4, 3, wire="float32").timing(fast, 8, BARE).step_s == pytest.approx((0.04 + 0.175 - 0.03) / 4)
    # bf16 on the wire: half the bytes, at the engine's compressed ring's share of the link
    bf16 = DiLoCo(4).timing(fast, 8, BARE).step_s
    assert bf16 == pytest.approx((0.04 + 0.0875 / 0.87 - 0.01) / 4)
    # int8: the exchange, a code per value and a scale per 256
    assert DiLoCo(4, wire="int8").timing(fast, 8, BARE).step_s == pytest.approx(
        (0.04 + 1.75 * int8_bytes(25_000_000) / (0.70 * GB) - 0.01) / 4)
    assert DiLoCo(4).timing(prof, 1, BARE).step_s == 0.31
    with pytest.raises(ValueError, match="sync_every must be at least 1"):
        DiLoCo(0)
    with pytest.raises(ValueError, match="sync_delay must be between 1 and sync_every \\(4\\), got 5"):
        DiLoCo(4, 5)
    with pytest.raises(ValueError, match="not 'fp8'"):
        DiLoCo(4, wire="fp8")


def test_diloco_fragments_spread_the_rounds_allreduce_over_its_steps():
    """Fragments as the strategy schedules them (lightning_mccl.diloco.schedule): fragment f syncs after step
    ceil((f + 1) H / F) of the round, its outer step waits tau steps later; the link sends one allreduce at a time."""
    quarters = [p(f"w{i}", 6_250_000, 0.005) for i in range(4)]  # 4 x 25 MB: 43.75 ms each on 8 hosts, float32
    fast = profile(quarters, forward=0.002, backward=0.008, step=0.01)
    whole = DiLoCo(4, wire="float32", fragments=1).timing(fast, 8, BARE)
    assert whole.step_s == pytest.approx((0.04 + 0.175 - 0.01) / 4)
    # H = 4, F = 4, tau 1: a quarter of the model each step, 43.75 ms, behind 10 ms of compute: the link sets the
    # pace, each step as long as one fragment's allreduce (the whole model's 175 ms a round, nothing more)
    four = DiLoCo(4, wire="float32", fragments=4).timing(fast, 8, BARE)
    assert four.step_s == pytest.approx(0.175 / 4)
    assert four.comm_s == pytest.approx(whole.comm_s)
    # the default, "auto" (the strategy's): min(H, the 4 tensors), so H = 4 is the 4 fragments above, H = 2 two
    # and H = 8 four (a fragment a tensor)
    assert DiLoCo(4, wire="float32").timing(fast, 8, BARE) == four
    assert [DiLoCo(h).parts(fast) for h in (1, 2, 4, 8)] == [1, 2, 4, 4]
    assert DiLoCo(2, wire="float32").timing(fast, 8, BARE) == DiLoCo(2, wire="float32", fragments=2).timing(
        fast, 8, BARE)
    # H = 4, F = 2, steps of 50 ms: each half (87.5 ms) starts after steps 2 and 4 and is waited for a step later,
    # 37.5 ms exposed each: a round of 4 x 50 + 2 x 37.5 ms
    slow = profile(quarters, forward=0.01, backward=0.04, step=0.05)
    assert DiLoCo(4, wire="float32", fragments=2).timing(slow, 8, BARE).step_s == pytest.approx((0.2 + 0.075) / 4)
    # the same at tau = 2: each half hidden behind two steps (100 ms > 87.5), the first one's outer step after
    # step 4, the second's after the next round's step 2: no wait at all
    assert DiLoCo(4, 2, wire="float32", fragments=2).timing(slow, 8, BARE).step_s == pytest.approx(0.05)
    # a step long enough hides every fragment; the device work is the whole model's, once a round
    kernels = Kernels(pseudo_gradient=1e-12, outer_step=2e-12)
    long = profile(quarters, step=0.31, kernels=kernels)
    assert DiLoCo(4, wire="float32", fragments=4).timing(long, 8, BARE).step_s == pytest.approx(
        (4 * 0.31 + 100e6 * 3e-12) / 4)
    with pytest.raises(ValueError, match="fragments=5 is more than the model's 4 parameter tensors"):
        DiLoCo(4, fragments=5).timing(long, 8, BARE)
    for bad in (0, 1.5, True, "Auto"):
        with pytest.raises(ValueError, match=rf"^DiLoCo\(fragments={bad!r}\): expected the number of parts the "
                                             r"parameters sync in, an int >= 1, or 'auto'"):
            DiLoCo(4, fragments=bad)


def test_diloco_rounds_are_walked_to_their_steady_state(monkeypatch):
    """A link slower than the steps queues allreduces over several rounds; the walk's mean of its last rounds is
    that of a far longer walk, within 1%, over random settings."""
    import random

    from lightning_mccl.plan import methods

    rng = random.Random(2)
    for _ in range(500):
        h = rng.randint(1, 8)
        tau, fragments, step = rng.randint(1, h), rng.randint(1, 10), rng.uniform(0.01, 0.3)
        syncs = [(rng.uniform(0, 0.6), rng.uniform(0, 0.01), rng.uniform(0, 0.01)) for _ in range(fragments)]
        walked = methods._round_s(step, h, tau, syncs)
        with monkeypatch.context() as m:
            m.setattr(methods, "WALK_ROUNDS", 800)
            assert walked == pytest.approx(methods._round_s(step, h, tau, syncs), rel=0.01)
        assert walked >= h * step + sum(p + o for _, p, o in syncs) - 1e-12  # never less than the device's work


def test_predictions_compare_with_one_mac():
    prof = profile([p("w", 25_000_000, 0.3)], step=0.31)
    ddp = DDP(1000)
    rows = predict(prof, BARE, [ddp], [1, 2, 4])
    assert [r.hosts for r in rows] == [1, 2, 4]
    one, two, four = rows
    assert (one.step_s, one.efficiency, one.speedup, one.samples_per_s) == (0.31, 1.0, 1.0, pytest.approx(8 / 0.31))
    assert two.step_s == pytest.approx(0.31 + 0.1)  # 100 MB once over the ring after the backward pass
    assert four.step_s == pytest.approx(0.31 + 0.15)
    assert four.efficiency == pytest.approx(0.31 / 0.46)
    assert four.speedup == pytest.approx(4 * 0.31 / 0.46)
    assert four.samples_per_s == pytest.approx(32 / 0.46)
    assert four.exposed_s == pytest.approx(0.15)


def test_build_methods_names_an_unknown_one():
    assert [m.name for m in build_methods(["diloco", "ddp"], Settings())] == ["diloco", "ddp"]
    with pytest.raises(ValueError, match="unknown method 'fp8'"):
        build_methods(["fp8"], Settings())


def test_the_plans_defaults_are_the_strategys():
    """The plan reads the strategies' defaults where they are declared (the wire policy's rows, DiLoCo's
    settings), and the fleet's DiLoCo config trains with them."""
    from lightning_mccl import wire_policy
    from lightning_mccl.diloco.settings import FRAGMENTS, SYNC_DELAY, SYNC_EVERY

    s = Settings()
    rows = wire_policy.ROWS
    assert (s.bucket_mb, s.powersgd_bucket_mb, s.int8_bucket_mb, s.powersgd_rank, s.sync_every, s.sync_delay,
            s.fragments) == (
        rows[None].bucket_mb, rows["powersgd"].bucket_mb, rows["int8"].bucket_mb,
        rows["powersgd"].options["matrix_approximation_rank"], SYNC_EVERY, SYNC_DELAY, FRAGMENTS)
    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "vit_fleet24_diloco.yaml")
    with open(config) as f:
        strategy = yaml.safe_load(f)["trainer"]["strategy"]["init_args"]
    assert (s.sync_every, s.sync_delay, s.diloco_wire) == (
        strategy["sync_every"], strategy["sync_delay"], strategy["compress"])
