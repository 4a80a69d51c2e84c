"""What the ranks of the soak run: many mixed collectives, then many init/destroy cycles, sampling this
process's resident memory, open file descriptors and threads as they go.

Mixed phase: one process group; every collective once at max_elems, then `collectives` calls, each a
collective drawn from collectives.OPS with an element count drawn log-uniformly from 1..max_elems (every
rank draws the same sequence from `seed`), every result checked exactly. Cycles phase: `cycles` times init_process_group("mccl") on a fresh key space
of the harness's store (a PrefixStore per cycle), one checked all-reduce, destroy_process_group().
"""
from __future__ import annotations

import math
import os
import random
from datetime import timedelta

import torch.distributed as dist

from lightning_mccl.testing import now
from .collectives import OPS, run_op


def usage() -> dict:
    """This process's resident memory (KiB, VmRSS), open file descriptors and threads, from /proc."""
    rss_kb = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss_kb = int(line.split()[1])
                    break
    except OSError:
        pass
    if rss_kb is None:  # not Linux: the peak is the best the standard library offers
        import resource

        rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if os.uname().sysname == "Darwin" else 1)
    return {"rss_kb": rss_kb, "fds": _count("/proc/self/fd", "/dev/fd"), "threads": _count("/proc/self/task")}


def _count(*dirs):
    for d in dirs:
        try:
            return len(os.listdir(d))
        except OSError:
            continue
    return None


def soak(chan, collectives: int, cycles: int, seed: int, max_elems: int, samples: int) -> None:
    rng = random.Random(seed)
    wrong = []
    if collectives:
        chan.init_process_group()
        every = max(1, collectives // samples)
        t0 = now()
        # Every collective once at the largest size first: buffers the engine keeps for reuse (sized by the
        # largest message seen so far) reach their high-water mark before any sample is judged.
        for op in OPS:
            bad = run_op(op, max_elems, chan.rank, chan.world, 0)
            if bad:
                wrong.append(f"warm-up {op} of {max_elems}: {bad}")
        for i in range(collectives):
            op = rng.choice(OPS)
            n = int(math.exp(rng.uniform(0.0, math.log(max_elems))))
            bad = run_op(op, n, chan.rank, chan.world, i)
            if bad and len(wrong) < 20:
                wrong.append(f"#{i} {op} of {n}: {bad}")
            if i % every == 0 or i == collectives - 1:
                chan.send("sample", phase="mixed", i=i, **usage())
        chan.send("phase", phase="mixed", seconds=now() - t0)
        dist.destroy_process_group()
    if cycles:
        base = chan.store()
        every = max(1, cycles // samples)
        t0 = now()
        for i in range(cycles):
            store = dist.PrefixStore(f"cycle{i}", base)
            dist.init_process_group("mccl", store=store, rank=chan.rank, world_size=chan.world,
                                    timeout=timedelta(seconds=chan.pg_timeout_s))
            bad = run_op("allreduce", 256, chan.rank, chan.world, i)
            if bad and len(wrong) < 20:
                wrong.append(f"cycle {i}: {bad}")
            dist.destroy_process_group()
            if i % every == 0 or i == cycles - 1:
                chan.send("sample", phase="cycles", i=i, **usage())
        chan.send("phase", phase="cycles", seconds=now() - t0)
    chan.send("done", wrong=wrong)
