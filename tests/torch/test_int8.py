"""The 8-bit allreduce through torch (lightning_mccl.int8): DDP's gradients through int8_hook against a float64
reference of the ranks' own gradients, every rank holding the same bits, whichever codec runs the per-value work
(torch ops on the tensor's device, or the engine) and when ranks mix them; all_reduce's error feedback (the results
plus the residuals hold the inputs) with either codec; and the bad-input errors, named. The CUDA cases run on the
GPU host (every rank on one GPU)."""
from __future__ import annotations

import numpy as np
import pytest

from lightning_mccl.testing import backend_name, run_ranks

pytestmark = pytest.mark.skipif(backend_name() != "mccl", reason="the 8-bit allreduce is mccl's")


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Tanh(), torch.nn.Linear(300, 10))


def _flat_grads(model):
    import torch

    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().cpu().numpy()


def _ddp_grads(x, y, device, state, steps=1):
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lightning_mccl.int8 import int8_hook

    ddp = DDP(_model().to(device), bucket_cap_mb=0.02)  # several buckets
    ddp.register_comm_hook(state, int8_hook)
    for _ in range(steps):  # later steps add the residuals of the earlier ones
        ddp.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
    return _flat_grads(ddp.module)


def _ddp_worker(rank, world, device, codecs):
    import torch
    import torch.nn.functional as F

    from lightning_mccl.int8 import Int8State

    g = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(32, 64, generator=g).to(device), torch.randint(0, 10, (32,), generator=g).to(device)
    local = _model().to(device)
    F.cross_entropy(local(x), y).backward()
    out = {"local": _flat_grads(local)}
    for name, codec in codecs.items():  # "mixed": one codec for this rank, another for the next
        out[name] = _ddp_grads(x, y, device, Int8State(codec=codec[rank % len(codec)] if isinstance(codec, tuple)
                                                        else codec), steps=2)
    return out


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


CUDA = pytest.mark.skipif(not _cuda(), reason="no CUDA device (the GPU host runs it: every rank on one GPU)")
# Per device, the codecs whose results must agree bit for bit: the tensor's device's torch ops, the engine, and
# ranks that mix the two.
CODECS = {"torch": "torch", "engine": "engine", "mixed": ("torch", "engine")}


@pytest.mark.parametrize("device,world,algo", [("cpu", 2, "exchange"), ("cpu", 4, "exchange"), ("cpu", 4, "ring"),
                                              pytest.param("cuda", 3, "exchange", marks=CUDA),
                                              pytest.param("cuda", 3, "ring", marks=CUDA)])
def test_hook_averages_gradients_within_the_8_bit_bound_whichever_codec(device, world, algo):
    results = run_ranks(_ddp_worker, world, args=(device, CODECS), timeout=120, env={"MCCL_INT8_ALGO": algo})
    local = [r["local"] for r in results]
    exact = sum(local) / world
    for name in CODECS:
        for r in range(world):
            assert np.array_equal(results[r][name], results[0]["torch"]), f"rank {r}'s {name} gradients differ"
    # Two steps of the same gradients: the second adds the first's residuals (each within the 8-bit bound: each
    # rank's values encoded once, error <= their largest magnitude / 252, the sum once more at its owner, and in
    # the ring each of the world - 2 partial sums on the way, none larger than the magnitudes summed).
    encodings = 2 if algo == "exchange" else world
    bound = 2 * encodings * sum(np.abs(g).max() for g in local) / 252 / world * 1.01
    error = np.abs(results[0]["torch"] - exact)
    assert error.max() <= bound, f"largest error {error.max():.3g} above the bound {bound:.3g}"
    assert error.max() > 1e-6 * np.abs(exact).max(), "the gradients look exact: were they compressed?"


def _feedback_worker(rank, world, codec):
    import torch

    from lightning_mccl import int8

    feedback = int8.ErrorFeedback()
    x = torch.from_numpy(np.random.default_rng(rank).uniform(-1, 1, 5000)).float()
    total = torch.zeros(5000, dtype=torch.float64)
    for _ in range(20):
        t = x.clone()
        int8.all_reduce(t, feedback.residual("w", t, int8.residual_device(t, codec)), op="sum", codec=codec).wait()
        total += t.double()
    plain = x.clone()
    int8.all_reduce(plain, None, op=torch.distributed.ReduceOp.AVG, codec=codec).wait()
    return {"total": total.numpy(), "residual": feedback.state_dict()["w"].double().numpy(), "plain": plain.numpy()}


@pytest.mark.parametrize("codec", ["engine", "torch"])
def test_error_feedback_keeps_what_the_results_lack(codec):
    results = run_ranks(_feedback_worker, 2, args=(codec,), timeout=60)
    inputs = [np.random.default_rng(r).uniform(-1, 1, 5000).astype(np.float32).astype(np.float64) for r in range(2)]
    exact = sum(inputs)
    kept = sum(r["residual"] for r in results)
    # 20 steps: the results lack exactly what the residuals hold, to float32's rounding
    assert np.abs(20 * exact - results[0]["total"] - kept).max() < 1e-4
    assert np.abs(kept).max() <= 3 * 2 / 252 * 1.001  # one step's error at most: two contributions and the sum
    assert np.abs(results[0]["plain"] - exact / 2).max() <= 3 * 2 / 252 / 2 * 1.001


def test_residuals_live_where_the_codec_runs_and_survive_a_checkpoint():
    import torch

    from lightning_mccl import int8

    on_device = torch.ones(10, device="meta")  # a device without CUDA or MPS: only where tensors are, not values
    assert int8.residual_device(on_device) == on_device.device and int8.residual_device(torch.ones(3)).type == "cpu"
    assert int8.residual_device(on_device, "engine").type == "cpu"
    feedback = int8.ErrorFeedback()
    kept = feedback.residual("bucket", torch.ones(10))
    kept += 0.5
    assert feedback.residual("bucket", torch.ones(10)) is kept
    restored = int8.ErrorFeedback()
    restored.load_state_dict(feedback.state_dict())
    assert torch.equal(restored.residual("bucket", torch.ones(10)), kept)  # resumed exactly
    moved = restored.residual("bucket", on_device)  # moved where the codec now runs
    assert moved.device == on_device.device and moved.shape == kept.shape
    assert torch.equal(feedback.residual("bucket", torch.ones(11)), torch.zeros(11))  # DDP rebuilt its buckets


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
                 lambda: int8.int8_hook(int8.Int8State(), _Bucket(torch.ones(8, dtype=torch.complex64))),
                 lambda: int8.all_reduce(torch.ones(8), None, codec="gpu"),
                 lambda: int8.Int8State(codec="cuda")):
        try:
            call()
            messages.append("accepted")
        except ValueError as e:
            messages.append(str(e))
    return messages


def test_bad_input_is_a_value_error_naming_it():
    messages = run_ranks(_errors_worker, 2, timeout=60)[0]
    assert "takes float32 tensors, got torch.int32" in messages[0]
    assert "residual must be a contiguous float32 tensor of 8 elements on cpu (where the engine encodes), got 7 " \
        "of torch.float32 on cpu" in messages[1]
    assert "op='max', expected 'avg' or 'sum'" in messages[2]
    assert "sums or averages" in messages[3]
    assert "compress='int8'" in messages[4] and "torch.complex64" in messages[4]
    assert "all_reduce: codec='gpu', expected one of 'auto', 'torch', 'engine'" in messages[5]
    assert "Int8State: codec='cuda'" in messages[6]
