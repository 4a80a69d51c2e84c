"""MPS tensors in place or staged (csrc/torch/host_memory.hpp, mps_memory.hpp), on a Mac only: the same
ordering checks as test_cuda_in_place.py (which runs the generic part on CUDA), on MPS memory.

The path is what torch's MPS allocator says for each buffer (shared storage: in place; private: staged);
either way the results must be right, the engine must read what the producing kernels wrote (the memory
holds NaN before them) and must not overwrite an output before an earlier kernel has read it. The path
counters must agree with the binding's answer; MCCL_DEVICE_IN_PLACE=0 must stage everything.
"""
import pytest
import torch

from lightning_mccl.testing import run_ranks

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(),
                                reason="needs Apple silicon with MPS (runs in .github/workflows/macos.yml)")

COUNT = 1_000_003


def _values(rank, count, salt=0):
    g = torch.Generator().manual_seed(900 + 10 * rank + salt)
    return torch.randn(count, generator=g, dtype=torch.float64)


def mps_in_place(rank, world):
    import torch.distributed as dist
    from lightning_mccl.backend import extension as _C

    dev = torch.device("mps")
    res = {"built": _C.mps_mapping_built()}
    red = torch.full((COUNT,), float("nan"), device=dev)
    gin = torch.full((COUNT,), float("nan"), device=dev)
    gout = torch.full((world * COUNT,), -1.0, device=dev)
    res["path"] = [list(_C.device_memory_path(t)) for t in (red, gin, gout)]
    src = [_values(rank, COUNT, k).to(dev, torch.float32) for k in range(2)]
    torch.mps.synchronize()
    dist.barrier()
    before = _C.device_path_counts()
    x = torch.randn(2048, 2048, device=dev)
    for _ in range(30):  # a long producer queued ahead of the inputs' kernels
        x = torch.tanh(x @ x)
    red.copy_(src[0] + 0.0 * x[0, 0])
    gin.copy_(src[1] + 0.0 * x[0, 0])
    old_seen = gout * 1.0  # reads gout's old values: the engine must not overwrite them first
    works = [dist.all_reduce(red, async_op=True), dist.all_gather_into_tensor(gout, gin, async_op=True)]
    after = _C.device_path_counts()
    for w in works:
        w.wait()
    got = {"all_reduce": red * 1.0, "all_gather": gout * 1.0, "old_seen": old_seen}  # after the wait
    got = {k: v.double().cpu() for k, v in got.items()}
    refs = {"all_reduce": sum(_values(r, COUNT, 0) for r in range(world)),
            "all_gather": torch.cat([_values(r, COUNT, 1) for r in range(world)]),
            "old_seen": torch.full((world * COUNT,), -1.0, dtype=torch.float64)}
    res["correct"] = {k: bool(torch.allclose(got[k], refs[k].float().double(), rtol=1e-5, atol=1e-4))
                      for k in refs}
    res["in_place"] = after["in_place"] - before["in_place"]
    res["staged"] = after["staged"] - before["staged"]
    return res


@pytest.mark.parametrize("mode", ["auto", "0"])
def test_mps_tensors_in_place_or_staged(mode):
    results = run_ranks(mps_in_place, 2, timeout=240, env={"MCCL_DEVICE_IN_PLACE": mode})
    for rank, res in enumerate(results):
        assert res["built"], "this build cannot ask torch's MPS allocator"
        assert all(res["correct"].values()), f"rank {rank}: wrong results {res['correct']} ({res['path']})"
        in_place = sum(ok for ok, _ in res["path"])
        assert (res["in_place"], res["staged"]) == (in_place, 3 - in_place), res
        if mode == "0":
            assert res["path"] == [[False, "MCCL_DEVICE_IN_PLACE=0"]] * 3
        else:
            # torch decides per buffer; say which, so the Mac run records it
            print(f"rank {rank}: MPS paths {res['path']}")
