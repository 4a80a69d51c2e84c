"""`lightning_mccl.stats(group)`: the engine's counters against traffic whose size is known exactly — the
ring's 2(n-1)/n of the buffer per rank, recursive doubling's fold/exchange/unfold on 3 ranks, a broadcast,
a send/recv pair, and the halved bytes of MCCL_WIRE_DTYPE=bf16 — plus the wait time of a caller blocked on
a late peer, and the clear error without an mccl group."""
from __future__ import annotations

import pytest

from harness import run_ranks

RING_COUNT = 600_000  # 2.4 MB of float32: above every recursive-doubling limit, divisible by 2 and 3
SMALL_COUNT = 1_000  # 4 KB: recursive doubling
LATE_S = 0.5


def _known_traffic(rank, world):
    import time

    import torch
    import torch.distributed as dist

    from lightning_mccl import stats
    from lightning_mccl.stats import FIELDS

    zero = dict.fromkeys(FIELDS, 0)

    def delta(before, kind):
        after, base = stats()["kinds"].get(kind, zero), before.get(kind, zero)
        return {k: after[k] - base[k] for k in FIELDS}

    out = {}
    before = stats()["kinds"]
    dist.all_reduce(torch.ones(RING_COUNT))
    out["ring"] = delta(before, "allreduce")
    before = stats()["kinds"]
    dist.all_reduce(torch.ones(SMALL_COUNT))
    out["rd"] = delta(before, "allreduce")
    before = stats()["kinds"]
    dist.broadcast(torch.ones(SMALL_COUNT), src=0)
    out["broadcast"] = delta(before, "broadcast")
    before = stats()["kinds"]
    if rank == 0:
        dist.send(torch.ones(SMALL_COUNT), dst=1)
    elif rank == 1:
        dist.recv(torch.empty(SMALL_COUNT), src=0)
    dist.barrier()
    out["p2p"] = delta(before, "send/recv")
    before = stats()["kinds"]
    if rank != 0:
        time.sleep(LATE_S)  # rank 0 is left waiting for the others
    dist.all_reduce(torch.ones(SMALL_COUNT))
    out["late"] = delta(before, "allreduce")
    snap = stats()
    out["last"] = (snap["last_issued_ns"], snap["last_done_ns"])
    return out


def test_counters_match_the_algorithms_true_byte_counts():
    # 3 ranks: the ring's segments and recursive doubling's fold both show (2 ranks run in test_comm_metrics.py)
    world = 3
    results = run_ranks(_known_traffic, world, timeout=120)
    ring_bytes = RING_COUNT * 4
    small = SMALL_COUNT * 4
    for rank, out in enumerate(results):
        ring = out["ring"]
        assert ring["calls"] == 1
        assert ring["bytes_sent"] == ring["bytes_received"] == 2 * (world - 1) * ring_bytes // world, (rank, ring)
        assert ring["busy_ns"] > 0
        # Recursive doubling on 3 ranks: rank 0 folds into rank 1 (and gets the result back), ranks 1 and 2
        # exchange, so rank 1 moves the buffer twice.
        rd_expected = small * (2 if rank == 1 else 1)
        assert out["rd"]["bytes_sent"] == out["rd"]["bytes_received"] == rd_expected, (rank, out["rd"])
        bcast = out["broadcast"]
        assert bcast["calls"] == 1
        assert bcast["bytes_received"] == (0 if rank == 0 else small), (rank, bcast)
        assert sum(r["broadcast"]["bytes_sent"] for r in results) == (world - 1) * small
        p2p = out["p2p"]
        assert (p2p["bytes_sent"], p2p["bytes_received"]) == {0: (small, 0), 1: (0, small)}.get(rank, (0, 0))
        assert p2p["calls"] == (1 if rank < 2 else 0)
        issued, done = out["last"]
        assert 0 < issued <= done
    # The blocking call of rank 0 waited for the late ranks; the late ranks hardly waited.
    assert results[0]["late"]["wait_ns"] >= 0.8 * LATE_S * 1e9, results[0]["late"]
    assert results[0]["late"]["busy_ns"] >= 0.8 * LATE_S * 1e9
    for out in results[1:]:
        assert out["late"]["wait_ns"] < 0.5 * LATE_S * 1e9, out["late"]


def _compressed_ring(rank, world):
    import torch
    import torch.distributed as dist

    from lightning_mccl import stats

    dist.all_reduce(torch.ones(RING_COUNT))
    dist.all_reduce(torch.ones(RING_COUNT, dtype=torch.float64))  # not compressed
    return stats()["kinds"]["allreduce"]


def test_counters_count_wire_bytes_after_compression():
    results = run_ranks(_compressed_ring, 3, env={"MCCL_WIRE_DTYPE": "bf16"}, timeout=120)
    ring_share = 2 * 2 * RING_COUNT // 3  # elements each rank sends in a ring allreduce on 3 ranks
    for out in results:
        assert out["calls"] == 2
        assert out["bytes_sent"] == out["bytes_received"] == ring_share * 2 + ring_share * 8


def test_stats_without_an_mccl_group_is_a_value_error_naming_why():
    import torch.distributed as dist

    from lightning_mccl import stats

    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        stats()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="not an mccl group"):
            stats()
    finally:
        dist.destroy_process_group()
