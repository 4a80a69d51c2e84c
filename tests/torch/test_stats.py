"""`lightning_mccl.stats(group)`: the engine's counters against traffic whose size is known exactly — the
ring's 2(n-1)/n of the buffer per rank, recursive doubling's fold/exchange/unfold on 3 ranks, a broadcast,
a send/recv pair, and the halved bytes of MCCL_WIRE_DTYPE=bf16 — plus the wait time of a caller blocked on
a late peer, and the errors without an mccl group, naming why. `lightning_mccl.timeline(group)` on the same
run: the two allreduces and the broadcast inside the caller's clock_ns() window, with their kinds, bytes and
times in order, and nothing recorded by a group made with Options(timeline_entries=0); with
MCCL_WIRE_DTYPE=bf16, its wire_bytes: half of a float32 allreduce's bytes, all of a broadcast's."""
from __future__ import annotations

import pytest

from lightning_mccl.testing import run_ranks

RING_COUNT = 600_000  # 2.4 MB of float32: above every recursive-doubling limit, divisible by 2 and 3
SMALL_COUNT = 1_000  # 4 KB: recursive doubling
LATE_S = 0.5


def _known_traffic(rank, world):
    import time

    import torch
    import torch.distributed as dist

    import lightning_mccl
    from lightning_mccl import clock_ns, stats, timeline
    from lightning_mccl.counters import FIELDS

    zero = dict.fromkeys(FIELDS, 0)

    def delta(before, kind):
        after, base = stats()["kinds"].get(kind, zero), before.get(kind, zero)
        return {k: after[k] - base[k] for k in FIELDS}

    out = {}
    window_start = clock_ns()
    before = stats()["kinds"]
    dist.all_reduce(torch.ones(RING_COUNT))
    out["ring"] = delta(before, "allreduce")
    before = stats()["kinds"]
    dist.all_reduce(torch.ones(SMALL_COUNT))
    out["rd"] = delta(before, "allreduce")
    before = stats()["kinds"]
    dist.broadcast(torch.ones(SMALL_COUNT), src=0)
    out["broadcast"] = delta(before, "broadcast")
    out["window"] = (window_start, clock_ns())
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
    out["timeline"] = timeline()
    unrecorded = dist.new_group(backend="mccl", pg_options=lightning_mccl.Options(timeline_entries=0))
    dist.all_reduce(torch.ones(SMALL_COUNT), group=unrecorded)
    out["unrecorded"] = timeline(unrecorded)
    return out


WORLD = 3  # the ring's segments and recursive doubling's fold both show (2 ranks run in test_comm_metrics.py)


@pytest.fixture(scope="module")
def known_traffic():
    return run_ranks(_known_traffic, WORLD, timeout=120)


def test_counters_match_the_algorithms_true_byte_counts(known_traffic):
    world, results = WORLD, known_traffic
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


def test_timeline_lists_the_collectives_in_the_callers_window(known_traffic):
    first_seqs = set()
    for rank, out in enumerate(known_traffic):
        start, end = out["window"]
        entries = [e for e in out["timeline"] if start <= e["issued_ns"] <= end]
        assert [(e["kind"], e["bytes"]) for e in entries] == [
            ("allreduce", RING_COUNT * 4), ("allreduce", SMALL_COUNT * 4), ("broadcast", SMALL_COUNT * 4)], rank
        seqs = [e["seq"] for e in entries]
        assert seqs == list(range(seqs[0], seqs[0] + 3)), (rank, seqs)
        first_seqs.add(seqs[0])
        for e in entries:
            assert set(e) == {"seq", "kind", "bytes", "wire_bytes", "issued_ns", "started_ns", "ready_ns", "done_ns"}
            assert e["wire_bytes"] == e["bytes"]  # uncompressed
            # CPU tensors: nothing to copy before the start, so ready == started
            assert start <= e["issued_ns"] <= e["started_ns"] == e["ready_ns"] <= e["done_ns"] <= end, (rank, e)
        for prev, nxt in zip(entries, entries[1:]):
            assert prev["done_ns"] <= nxt["started_ns"]
        times = [e["issued_ns"] for e in out["timeline"]]
        assert times == sorted(times), "the timeline is oldest first"
        assert out["timeline"][-1]["kind"] == "allreduce"  # the late one, after the window
        assert out["unrecorded"] == []
    assert len(first_seqs) == 1, "one collective has one seq on every rank"


def _compressed_ring(rank, world):
    import torch
    import torch.distributed as dist

    from lightning_mccl import stats, timeline
    from lightning_mccl.backend import wire_dtype_of

    dist.all_reduce(torch.ones(RING_COUNT))
    dist.all_reduce(torch.ones(RING_COUNT, dtype=torch.float64))  # not compressed
    dist.broadcast(torch.ones(SMALL_COUNT), src=0)  # not a reduction: not compressed
    return {"allreduce": stats()["kinds"]["allreduce"], "wire": wire_dtype_of(),
            "timeline": [(e["kind"], e["bytes"], e["wire_bytes"]) for e in timeline()]}


def test_counters_count_wire_bytes_after_compression():
    results = run_ranks(_compressed_ring, 3, env={"MCCL_WIRE_DTYPE": "bf16"}, timeout=120)
    ring_share = 2 * 2 * RING_COUNT // 3  # elements each rank sends in a ring allreduce on 3 ranks
    for out in results:
        assert out["allreduce"]["calls"] == 2
        assert out["allreduce"]["bytes_sent"] == out["allreduce"]["bytes_received"] == ring_share * 2 + ring_share * 8
        assert out["wire"] == "bf16"  # what the engine read
        assert out["timeline"][-3:] == [("allreduce", RING_COUNT * 4, RING_COUNT * 2),
                                        ("allreduce", RING_COUNT * 8, RING_COUNT * 8),
                                        ("broadcast", SMALL_COUNT * 4, SMALL_COUNT * 4)], out["timeline"]


def test_stats_and_timeline_without_an_mccl_group_are_value_errors_naming_why():
    import torch.distributed as dist

    from lightning_mccl import clock_ns, stats, timeline

    from lightning_mccl.backend import wire_dtype_of

    for call, name in ((stats, "stats"), (timeline, "timeline")):
        with pytest.raises(ValueError, match=f"^lightning_mccl.{name}: torch.distributed is not initialized$"):
            call()
    assert wire_dtype_of() is None
    before = clock_ns()
    assert 0 < before <= clock_ns()  # needs no group
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for call, name in ((stats, "stats"), (timeline, "timeline")):
            with pytest.raises(ValueError, match=f"^lightning_mccl.{name}: the group's backend is 'gloo', not mccl$"):
                call()
        assert wire_dtype_of() is None
    finally:
        dist.destroy_process_group()
