"""In place or staged (csrc/torch/host_memory.hpp), and staging's reused host buffers (host_buffers.hpp):
the parts that run without an accelerator. The device queries themselves run on CUDA
(test_cuda_in_place.py) and on a Mac (tests/torch/test_mps_memory.py).

Meta tensors stand in for accelerator tensors: the checks before the device query (empty, not contiguous,
MCCL_DEVICE_IN_PLACE) answer for them as for any device. One rank: staging is the same at any size.
"""
import os
import sys
import time

import torch

from lightning_mccl.testing import run_ranks


def paths_and_buffers(rank, world):
    import torch.distributed as dist
    from lightning_mccl.backend import extension as _C

    res = {"built": _C.mps_mapping_built(), "cpu": list(_C.device_memory_path(torch.zeros(4))),
           "cpu_strided": list(_C.device_memory_path(torch.zeros(4, 4).t()))}
    meta = torch.empty(4, 4, device="meta")
    res["meta_empty"] = list(_C.device_memory_path(torch.empty(0, device="meta")))
    res["meta_strided"] = list(_C.device_memory_path(meta.t()))
    # MCCL_DEVICE_IN_PLACE is read once, at the first query that gets that far (tests/launcher/
    # test_doctor_reduction.py sees the default: "no CPU mapping is known for meta memory")
    os.environ["MCCL_DEVICE_IN_PLACE"] = "sometimes"
    try:
        _C.device_memory_path(meta)
        res["bad_value"] = None
    except ValueError as e:
        res["bad_value"] = str(e)
    os.environ["MCCL_DEVICE_IN_PLACE"] = "0"  # a failed read is retried
    res["off"] = list(_C.device_memory_path(meta))

    # Non-contiguous CPU tensors travel through a reused host buffer: once a collective lets go of its
    # buffer (on the completion pool, just after wait() returns), the next one takes it.
    def returned(cached):
        deadline = time.monotonic() + 30
        while _C.host_buffer_counts()["cached_bytes"] <= cached:
            assert time.monotonic() < deadline, "a staging buffer never came back to the free list"
            time.sleep(0.001)

    before = _C.host_buffer_counts()
    got = []
    for k in range(3):
        base = torch.arange(4000, dtype=torch.float32).reshape(40, 100) * (rank + 1) + k
        t = base.t()
        dist.all_reduce(t)
        returned(before["cached_bytes"])
        got.append(bool(torch.equal(t, sum(torch.arange(4000.).reshape(40, 100) * (r + 1) + k
                                           for r in range(world)).t())))
    after = _C.host_buffer_counts()
    res["correct"] = got
    res["fresh"] = after["fresh"] - before["fresh"]
    res["reused"] = after["reused"] - before["reused"]
    res["cached_bytes"] = after["cached_bytes"]
    return res


def test_path_choice_fallback_and_reused_host_buffers():
    for rank, res in enumerate(run_ranks(paths_and_buffers, 1, timeout=120)):
        assert res["built"] is (sys.platform == "darwin")
        assert res["cpu"] == [True, "CPU memory"] and res["cpu_strided"] == [False, "not contiguous"]
        assert res["meta_empty"] == [False, "an empty tensor"]
        assert res["meta_strided"] == [False, "not contiguous"]
        assert res["bad_value"] and "MCCL_DEVICE_IN_PLACE='sometimes' is not one of auto, 0" in res["bad_value"]
        assert res["off"] == [False, "MCCL_DEVICE_IN_PLACE=0"]
        assert all(res["correct"]), res
        assert (res["fresh"], res["reused"]) == (1, 2), res
        assert res["cached_bytes"] >= 16000, res  # 16 000 bytes, rounded up to a 16 KiB size class
