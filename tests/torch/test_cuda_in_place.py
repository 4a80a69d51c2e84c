"""Accelerator tensors the CPU can address are read and written in place (csrc/torch/host_memory.hpp),
ordered by the same code as staging (stream_order.hpp); run for real on CUDA, skipped without a GPU.

On a Mac this is MPS memory in shared storage mode; everything but the allocator query (mps_memory.hpp)
is generic, and is tested here with CUDA tensors over pinned host memory (torch.as_tensor of the pinned
allocation's __cuda_array_interface__: the GPU reads and writes it over the bus, the CPU directly).
Caching-allocator tensors (device memory) stay staged.

Each rank queues a long kernel (torch.cuda._sleep) on its current stream, then the kernels that produce
the inputs (the memory holds NaN until they run), and a kernel that still reads an output's old values;
then it issues the collectives. The call must return while the sleep is pending, the engine must read
the produced values (no NaN), must not write an output before the earlier reader has run, and kernels
queued after wait() (or on the Future's value) must see the results: all against float64 references.
The path counters prove each host-visible tensor went in place (and, with MCCL_DEVICE_IN_PLACE=0, staged).
"""
from __future__ import annotations

import time

import pytest
import torch

from lightning_mccl.testing import run_ranks
from test_cuda_no_stall import cycles_per_s

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SLEEP_S = 1.0
COUNT = 100_003
TYPESTR = {torch.float32: "<f4", torch.float64: "<f8"}


def _values(rank, count, salt=0):
    g = torch.Generator().manual_seed(700 + 10 * rank + salt)
    return torch.randn(count, generator=g, dtype=torch.float64)


def host_visible(count, dtype=torch.float32):
    """A CUDA tensor over pinned host memory (NaN-filled), and the pinned CPU tensor it shares bytes with."""
    pinned = torch.full((count,), float("nan"), dtype=dtype, pin_memory=True)

    class Pinned:  # torch.as_tensor keeps this object (so the pinned tensor) alive with the CUDA tensor
        keep = pinned
        __cuda_array_interface__ = {"shape": (count,), "typestr": TYPESTR[dtype], "strides": None,
                                    "data": (pinned.data_ptr(), False), "version": 2}

    t = torch.as_tensor(Pinned(), device="cuda")
    assert t.is_cuda and t.data_ptr() == pinned.data_ptr()
    return t, pinned


def in_place(rank, world):
    import torch.distributed as dist
    from lightning_mccl.backend import extension as _C

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    sleep_cycles = int(SLEEP_S * cycles_per_s(dev))
    res = {}
    probe, _ = host_visible(8)
    res["path_host_visible"] = list(_C.device_memory_path(probe))
    res["path_device"] = list(_C.device_memory_path(torch.zeros(8, device=dev)))
    res["path_strided"] = list(_C.device_memory_path(host_visible(8)[0][::2]))

    def one_round(sleep):
        """Fresh tensors, the sleep, the producers, the collectives; the round's observations."""
        out = {}
        # produced on the device after the sleep (the host-visible memory holds NaN until then)
        src = [_values(rank, COUNT, k).to(dev, torch.float32) for k in range(3)]
        red, _ = host_visible(COUNT)
        fut_t, _ = host_visible(COUNT)
        gin, _ = host_visible(COUNT)
        gout, gout_host = host_visible(world * COUNT)
        gout_host.fill_(-1.0)  # the old contents, which a kernel queued before the call still reads
        strided, _ = host_visible(2 * COUNT)

        done = torch.cuda.Event()
        dist.barrier()
        before = _C.device_path_counts()
        torch.cuda._sleep(sleep)
        done.record()
        # kernels, not copy_: a device-to-"device" copy into pinned host memory may run synchronously
        torch.mul(src[0], 1.0, out=red)
        torch.mul(src[1], 1.0, out=fut_t)
        torch.mul(src[2], 1.0, out=gin)
        torch.mul(src[0], 1.0, out=strided[::2])
        old_seen = gout * 1.0  # reads gout's old values: the engine must not overwrite them before this runs
        out["pending_before_issue"] = not done.query()
        t0 = time.perf_counter()
        works = [dist.all_reduce(red, async_op=True),
                 dist.all_gather_into_tensor(gout, gin, async_op=True),
                 dist.all_reduce(strided[::2], async_op=True)]
        fut = dist.all_reduce(fut_t, async_op=True).get_future()
        out["issue_s"] = time.perf_counter() - t0
        out["pending_after_issue"] = not done.query()
        after = _C.device_path_counts()
        out["in_place"] = after["in_place"] - before["in_place"]
        out["staged"] = after["staged"] - before["staged"]
        for w in works:
            w.wait()
        got = {"all_reduce": red * 1.0, "future": fut.wait()[0] * 1.0, "all_gather": gout * 1.0,
               "strided": strided[::2] * 1.0, "old_seen": old_seen}  # kernels queued after the wait
        got = {k: v.double().cpu() for k, v in got.items()}

        everyone = [_values(r, COUNT, k) for r in range(world) for k in range(3)]
        ref_sum = [sum(everyone[3 * r + k] for r in range(world)) for k in range(3)]
        refs = {"all_reduce": ref_sum[0], "future": ref_sum[1],
                "all_gather": torch.cat([everyone[3 * r + 2] for r in range(world)]),
                "strided": ref_sum[0], "old_seen": torch.full((world * COUNT,), -1.0, dtype=torch.float64)}
        out["correct"] = {k: bool(torch.allclose(got[k], refs[k].float().double(), rtol=1e-5, atol=1e-4))
                          for k in refs}

        return out

    one_round(1000)  # warm: every kernel is loaded and the host buffers exist (lazy loading synchronizes)
    res.update(one_round(sleep_cycles))

    # point to point: the send reads in place, the receive writes in place
    right, left = (rank + 1) % world, (rank - 1) % world
    s, _ = host_visible(1000)
    r, _ = host_visible(1000)
    s.fill_(float(rank))
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, s, right), dist.P2POp(dist.irecv, r, left)]):
        w.wait()
    res["correct"]["send_recv"] = bool(torch.equal((r * 1.0).cpu(), torch.full((1000,), float(left))))
    return res


@pytest.mark.parametrize("mode", ["auto", "0"])
def test_host_visible_cuda_memory_is_used_in_place(mode):
    results = run_ranks(in_place, 2, timeout=240, env={"MCCL_DEVICE_IN_PLACE": mode})
    for rank, res in enumerate(results):
        assert all(res["correct"].values()), f"rank {rank}: wrong results {res['correct']}"
        assert res["pending_before_issue"], f"rank {rank}: the test's own set-up waited for the sleep ({res})"
        if mode == "auto":  # staged, this memory is copied host to host, which CUDA does synchronously (the
            # no-stall of staged device memory is test_cuda_no_stall's)
            assert res["pending_after_issue"], f"rank {rank}: the call waited for the caller's kernel ({res})"
            assert res["issue_s"] < SLEEP_S / 4, f"rank {rank}: issuing took {res['issue_s']:.3f} s"
        assert res["path_device"] == [False, "MCCL_DEVICE_IN_PLACE=0" if mode == "0" else "device memory"]
        if mode == "auto":
            assert res["path_host_visible"] == [True, "pinned host memory"]
            assert res["path_strided"] == [False, "not contiguous"]
            # all_reduce, both tensors of all_gather_into_tensor and the Future's all_reduce; the strided view
            assert (res["in_place"], res["staged"]) == (4, 1), res
        else:
            assert res["path_host_visible"] == [False, "MCCL_DEVICE_IN_PLACE=0"]
            assert (res["in_place"], res["staged"]) == (0, 5), res
