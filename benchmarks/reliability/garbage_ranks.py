"""What the ranks of a garbage trial run: a small deterministic training loop, gated by the harness.

The last rank publishes its address but reads the others' only when the harness says "go" (GatedStore),
so until then every other rank sits in its rendezvous accept loop, waiting for the last rank to connect,
with its mccl listener open: that is where the harness's hostile client connects to it. Before
the last step rank 0 waits for "finish" (the others wait in a barrier), so the training phase lasts until
the harness has made its connections. Each step checks one collective exactly (see collectives.run_op)
and applies an all-reduced gradient to float32 weights; the weights' digest must equal the digest of the
same run without any garbage, bit for bit.
"""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from lightning_mccl.testing import now
from .collectives import run_op

CHECK_OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter", "alltoall")
LR = 0.1


class GatedStore(dist.Store):
    """The rank's store, except that reading another rank's mccl address first waits for the harness's "go"."""

    def __init__(self, inner, chan):
        super().__init__()
        self.inner, self.chan, self.opened = inner, chan, False

    def get(self, key):
        if "mccl/addr/" in key and not self.opened:
            self.chan.send("waiting")
            if self.chan.wait_for("go", timeout=self.chan.pg_timeout_s * 0.8) is None:
                raise RuntimeError("the harness never said go")
            self.opened = True
        return self.inner.get(key)

    def set(self, key, value):
        return self.inner.set(key, value)

    def add(self, key, value):
        return self.inner.add(key, value)

    def compare_set(self, key, expected, desired):
        return self.inner.compare_set(key, expected, desired)

    def wait(self, keys, timeout=None):
        return self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def check(self, keys):
        return self.inner.check(keys)

    def num_keys(self):
        return self.inner.num_keys()

    def delete_key(self, key):
        return self.inner.delete_key(key)


def train_gated(chan, steps: int, n: int, gate_rank: int) -> None:
    t0 = now()
    chan.init_process_group(GatedStore(chan.store(), chan) if chan.rank == gate_rank else None)
    chan.send("joined", init_s=now() - t0)
    w = torch.zeros(n)
    wrong = []
    for step in range(steps):
        if step == steps - 1:
            if chan.rank == 0 and chan.wait_for("finish", timeout=chan.pg_timeout_s * 0.8) is None:
                raise RuntimeError("the harness never said finish")
            dist.barrier()
        bad = run_op(CHECK_OPS[step % len(CHECK_OPS)], n, chan.rank, chan.world, step)
        if bad:
            wrong.append(f"step {step}: {bad}")
        g = torch.Generator().manual_seed(1000 * step + chan.rank)
        grad = w - torch.randn(n, generator=g)
        dist.all_reduce(grad)
        w -= LR / chan.world * grad
    digest = hashlib.sha1(w.numpy().tobytes()).hexdigest()[:16]
    chan.send("trained", digest=digest, wrong=wrong)
    dist.destroy_process_group()
