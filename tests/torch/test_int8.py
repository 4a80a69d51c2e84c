"""The 8-bit allreduce through torch (lightning_mccl.int8): DDP's gradients through int8_hook against a float64
reference of the ranks' own gradients, every rank holding the same bits; all_reduce's error feedback (the
results plus the residuals hold the inputs); and the bad-input errors, named."""
from __future__ import annotations

import numpy as np
import pytest

from harness import backend_name, run_ranks

pytestmark = pytest.mark.skipif(backend_name() != "mccl", reason="the 8-bit allreduce is mccl's")

WORLD = 3


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Tanh(), torch.nn.Linear(300, 10))


def _flat_grads(model):
    import torch

    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().cpu().numpy()


def _ddp_worker(rank, world, device):
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lightning_mccl.int8 import Int8State, int8_hook

    g = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(32, 64, generator=g).to(device), torch.randint(0, 10, (32,), generator=g).to(device)
    local = _model().to(device)
    F.cross_entropy(local(x), y).backward()
    ddp = DDP(_model().to(device), bucket_cap_mb=0.02)  # several buckets
    ddp.register_comm_hook(Int8State(), int8_hook)
    F.cross_entropy(ddp(x), y).backward()
    return {"local": _flat_grads(local), "ddp": _flat_grads(ddp.module)}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _cuda(), reason="no CUDA device (the GPU host runs it: staged buckets, every rank on one GPU)"))])
def test_hook_averages_gradients_within_the_8_bit_bound(device):
    results = run_ranks(_ddp_worker, WORLD, args=(device,), timeout=120)
    local = [r["local"] for r in results]
    exact = sum(local) / WORLD
    # Each rank's gradient encoded once (error <= its largest magnitude / 252), the sum once more at its owner.
    bound = 2 * sum(np.abs(g).max() for g in local) / 252 / WORLD * 1.001
    for r in range(1, WORLD):
        assert np.array_equal(results[r]["ddp"], results[0]["ddp"]), f"rank {r}'s gradients differ from rank 0's"
    error = np.abs(results[0]["ddp"] - exact)
    assert error.max() <= bound, f"largest error {error.max():.3g} above the bound {bound:.3g}"
    assert error.max() > 1e-6 * np.abs(exact).max(), "the gradients look exact: were they compressed?"


def _feedback_worker(rank, world):
    import torch

    from lightning_mccl import int8

    feedback = int8.ErrorFeedback()
    x = torch.from_numpy(np.random.default_rng(rank).uniform(-1, 1, 5000)).float()
    total = torch.zeros(5000, dtype=torch.float64)
    for _ in range(20):
        t = x.clone()
        int8.all_reduce(t, feedback.residual("w", t), op="sum").wait()
        total += t.double()
    plain = x.clone()
    int8.all_reduce(plain, None, op=torch.distributed.ReduceOp.AVG).wait()
    return {"total": total.numpy(), "residual": feedback.state_dict()["w"].double().numpy(), "plain": plain.numpy()}


def test_error_feedback_keeps_what_the_results_lack():
    results = run_ranks(_feedback_worker, 2, timeout=60)
    inputs = [np.random.default_rng(r).uniform(-1, 1, 5000).astype(np.float32).astype(np.float64) for r in range(2)]
    exact = sum(inputs)
    kept = sum(r["residual"] for r in results)
    # 20 steps: the results lack exactly what the residuals hold, to float32's rounding
    assert np.abs(20 * exact - results[0]["total"] - kept).max() < 1e-4
    assert np.abs(kept).max() <= 2 * 2 / 252 * 1.001  # one step's error at most
    assert np.abs(results[0]["plain"] - exact / 2).max() <= 2 * 2 / 252 / 2 * 1.001


class _Bucket:
    def __init__(self, tensor):
        self._tensor = tensor

    def buffer(self):
        return self._tensor

    def index(self):
        return 0


def _errors_worker(rank, world):
    import torch

    from lightning_mccl import int8

    messages = []
    for call in (lambda: int8.all_reduce(torch.ones(8, dtype=torch.int32), None),
                 lambda: int8.all_reduce(torch.ones(8), torch.zeros(7)),
                 lambda: int8.all_reduce(torch.ones(8), None, op="max"),
                 lambda: int8.all_reduce(torch.ones(8), None, op=torch.distributed.ReduceOp.MAX),
                 lambda: int8.int8_hook(int8.Int8State(), _Bucket(torch.ones(8, dtype=torch.complex64)))):
        try:
            call()
            messages.append("accepted")
        except ValueError as e:
            messages.append(str(e))
    return messages


def test_bad_input_is_a_value_error_naming_it():
    messages = run_ranks(_errors_worker, 2, timeout=60)[0]
    assert "takes float32 tensors, got torch.int32" in messages[0]
    assert "residual must be a contiguous float32 CPU tensor of 8 elements, got 7" in messages[1]
    assert "op='max', expected 'avg' or 'sum'" in messages[2]
    assert "sums or averages" in messages[3]
    assert "compress='int8'" in messages[4] and "torch.complex64" in messages[4]
