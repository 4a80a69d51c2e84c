"""Demo: N local ranks over loopback check that `mccl` allreduce is right, then time it against Gloo.

    python examples/collective_check.py --nproc 4

Each rank builds every rank's input from a shared seed, so it can check the allreduce result against a
float64 reference on its own. Timings interleave mccl and gloo in the same run (medians).
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]  # bytes of float32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_input(rank: int, count: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randn(count, generator=g, dtype=torch.float64)


def time_allreduce(tensor: torch.Tensor, group, iters: int) -> float:
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def worker(rank: int, world: int, port: int) -> None:
    import lightning_mccl  # noqa: F401  (registers the backend)

    dist.init_process_group("mccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    rows = []
    for size in SIZES:
        count = size // 4
        expected = sum(rank_input(r, count) for r in range(world))
        t = rank_input(rank, count).float()
        dist.all_reduce(t)
        err = (t.double() - expected).abs().max().item() if count else 0.0
        ok = torch.allclose(t.double(), expected, rtol=1e-5, atol=1e-5 * world)
        iters = 20 if size <= (1 << 20) else 5
        buf = torch.ones(count)
        time_allreduce(buf, None, 2)
        time_allreduce(buf, gloo, 2)
        t_mccl = time_allreduce(buf, None, iters)
        t_gloo = time_allreduce(buf, gloo, iters)
        rows.append((size, ok, err, t_mccl, t_gloo))
    if rank == 0:
        factor = 2 * (world - 1) / world
        print(f"\nallreduce float32, {world} ranks on loopback (median of timed runs)\n")
        print(f"| size | correct (max abs err) | mccl ms | gloo ms | mccl busbw GB/s | gloo busbw GB/s | speedup |")
        print("|---|---|---|---|---|---|---|")
        for size, ok, err, tm, tg in rows:
            label = f"{size >> 20} MiB" if size >= (1 << 20) else f"{size >> 10} KiB"
            bw = lambda t: size * factor / t / 1e9
            print(f"| {label} | {'yes' if ok else 'NO'} ({err:.1e}) | {tm * 1e3:.3f} | {tg * 1e3:.3f} | "
                  f"{bw(tm):.2f} | {bw(tg):.2f} | {tg / tm:.1f}x |")
        sys.stdout.flush()
    bad = [r for r in rows if not r[1]]
    dist.destroy_process_group()
    if bad:
        raise SystemExit(f"rank {rank}: allreduce results wrong for sizes {[r[0] for r in bad]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="local ranks to start")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(args.nproc, free_port()), nprocs=args.nproc, join=True)


if __name__ == "__main__":
    main()
