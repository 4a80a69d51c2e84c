"""The measurement `mccl doctor` runs on the fleet, one rank per host, through the launcher:

    python -m lightning_mccl.launcher.doctor_bench --size-mib 16      # with torchrun's environment variables

Over the `mccl` backend, after `lightning_mccl.rendezvous` (torchrun's variables; it names the ranks that
did not arrive, and ends at --pg-timeout with a RendezvousError, one line on stderr), for every pair of
ranks (a < b):

- latency: the median round trip of a 4-byte send/recv ping-pong started by a, reported halved (one-way,
  as osu_latency does);
- bandwidth, each direction: the sender times ``send(size)`` until the receiver's 4-byte acknowledgement
  arrives (median), bytes / time.

Pairs are measured in rounds of disjoint pairs (round-robin "circle" schedule), so a fleet of n hosts
takes n - 1 rounds, not n(n - 1)/2 steps, and no host serves two pairs at once. Then the whole fleet runs
allreduce(size) and reports its bus bandwidth, time x 2(n - 1)/n, as nccl-tests do.

Before all that, every rank connects to every other from its own Python (`doctor_reach`): where one cannot,
every rank prints ``MCCL_DOCTOR_REACH [failures]`` and exits 1, before the process group (which would only time
out). With ``--model M --batch B``, every rank then times the model's training step on its device
(`doctor_speed`). Last, every rank reports its reduction path (doctor_reduction.py). Rank 0 prints one line,
``MCCL_DOCTOR_RESULT {json}``, on stdout; `mccl doctor` reads it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import List, Optional, Sequence, Tuple

from . import doctor_reach, doctor_reduction, doctor_speed

RESULT_MARKER = "MCCL_DOCTOR_RESULT "
REACH_MARKER = "MCCL_DOCTOR_REACH "
WARMUP = 2


def pair_rounds(n: int) -> List[List[Tuple[int, int]]]:
    """Every pair (a, b), a < b < n, exactly once, grouped into rounds of disjoint pairs (n - 1 rounds for
    even n, n for odd n, where one rank sits out each round)."""
    if n < 2:
        return []
    m = n + (n % 2)  # a "bye" rank m - 1 >= n for odd n
    ring = list(range(m))
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = ring[i], ring[m - 1 - i]
            if a < n and b < n:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ring = [ring[0], ring[-1]] + ring[1:-1]
    return rounds


def _round_trips(dist, peer: int, lead: bool, out, back, iters: int) -> Optional[float]:
    """Median time for the lead to send `out` and get `back` in return (None on the other side)."""
    times = []
    for i in range(WARMUP + iters):
        if lead:
            t0 = time.perf_counter()
            dist.send(out, peer)
            dist.recv(back, peer)
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
        else:
            dist.recv(out, peer)
            dist.send(back, peer)
    return statistics.median(times) if lead else None


def _ping_pong(dist, torch, peer: int, lead: bool, iters: int) -> Optional[float]:
    buf = torch.zeros(1, dtype=torch.float32)
    return _round_trips(dist, peer, lead, buf, buf, iters)


def _one_way(dist, torch, peer: int, sending: bool, big, iters: int) -> Optional[float]:
    ack = torch.zeros(1, dtype=torch.float32)
    median = _round_trips(dist, peer, sending, big, ack, iters)
    return big.numel() * big.element_size() / median if sending else None


def measure(size_bytes: int, iters: int, latency_iters: int) -> Optional[dict]:
    """Runs the measurements in an initialised process group; rank 0 gets the results, others None."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    big = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32)
    # latency[a][b] measured by a; bandwidth[s][d] measured by the sender s. Zero elsewhere, then summed.
    table = torch.zeros(2, world, world, dtype=torch.float64)
    for pairs in pair_rounds(world):
        dist.barrier()
        for a, b in pairs:
            if rank not in (a, b):
                continue
            peer = b if rank == a else a
            rtt = _ping_pong(dist, torch, peer, rank == a, latency_iters)
            if rtt is not None:
                table[0, a, b] = rtt / 2
            bw = _one_way(dist, torch, peer, rank == a, big, iters)  # a -> b
            if bw is not None:
                table[1, a, b] = bw
            bw = _one_way(dist, torch, peer, rank == b, big, iters)  # b -> a
            if bw is not None:
                table[1, b, a] = bw
    dist.all_reduce(table)
    allreduce = None
    if world > 1:
        times = []
        for i in range(WARMUP + iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(big)
            if i >= WARMUP:
                times.append(time.perf_counter() - t0)
        # every rank's time counts: the slowest one is the collective's
        t = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        seconds = float(t.item())
        nbytes = big.numel() * big.element_size()
        algbw = nbytes / seconds
        allreduce = {"size_bytes": nbytes, "seconds": seconds, "algbw": algbw,
                     "busbw": algbw * 2 * (world - 1) / world}
    if rank != 0:
        return None
    pairs = [{"a": a, "b": b, "latency_s": float(table[0, a, b]), "bandwidth_ab": float(table[1, a, b]),
              "bandwidth_ba": float(table[1, b, a])}
             for rnd in pair_rounds(world) for a, b in rnd]
    pairs.sort(key=lambda p: (p["a"], p["b"]))
    return {"world_size": world, "size_bytes": big.numel() * big.element_size(), "iters": iters,
            "latency_iters": latency_iters, "pairs": pairs, "allreduce": allreduce}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lightning_mccl.launcher.doctor_bench")
    parser.add_argument("--size-mib", type=float, default=16.0)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--latency-iters", type=int, default=50)
    parser.add_argument("--pg-timeout", type=float, default=60.0, help="process group timeout, seconds")
    parser.add_argument("--model", help="time this model's training step on every rank (doctor_speed)")
    parser.add_argument("--batch", type=int, default=32, help="samples per step for --model")
    parser.add_argument("--steps", type=int, default=5, help="timed steps for --model")
    args = parser.parse_args(argv)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    failed = doctor_reach.reach_master(rank) if rank != 0 else None
    if failed is not None:
        return _unreachable([failed])

    import torch.distributed as dist

    import lightning_mccl  # noqa: F401  (registers the backend)
    from ..rendezvous import RendezvousError, rendezvous

    timeout = timedelta(seconds=args.pg_timeout)
    try:
        store = rendezvous(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank, world, timeout)
    except RendezvousError as e:
        sys.stderr.write(f"RendezvousError: {e}\n")
        return 1
    failures = doctor_reach.reach_all(store, rank, world) if world > 1 else []
    if failures:
        return _unreachable(failures)
    dist.init_process_group("mccl", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        result = measure(int(args.size_mib * (1 << 20)), args.iters, args.latency_iters)
        speeds = None
        if args.model:
            speeds = [None] * world
            dist.all_gather_object(speeds, doctor_speed.measure_step(args.model, args.batch, args.steps))
        reduction = doctor_reduction.reports(dist)  # every rank
        if result is not None:
            result["reduction"] = reduction
            result["speed"] = speeds
            sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
            sys.stdout.flush()
    finally:
        dist.destroy_process_group()
    return 0


def _unreachable(failures: List[dict]) -> int:
    """Prints the failed connections (every rank that knows them, so that `mccl doctor` reads them whichever rank
    the launcher stops first) and returns the exit code."""
    sys.stdout.write(REACH_MARKER + json.dumps(failures) + "\n")
    sys.stdout.flush()
    return 1


if __name__ == "__main__":
    sys.exit(main())
