"""The real Metal reducer against the engine's CPU reducer (on a Mac with MPS; skipped elsewhere): the
gate's self-test, plus large odd-length buffers through ReductionPath with every rank agreeing (1 rank)."""
import datetime

import pytest
import torch
import torch.distributed as dist

from lightning_mccl.metal import gate, kernels
from lightning_mccl.metal.settings import MetalSettings

pytestmark = pytest.mark.skipif(kernels.unavailable_reason() is not None,
                                reason=f"Metal unavailable: {kernels.unavailable_reason()}")


def test_metal_kernels_pass_the_self_test():
    assert gate.self_test(kernels.MetalReducer(), seed=1) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", ["sum", "product", "min", "max"])
def test_metal_path_matches_the_cpu_reducer_bit_for_bit(dtype, op):
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=30))
    path = gate.ReductionPath(store, 0, 1, MetalSettings("1", 0), kernels.MetalReducer)
    assert path.decide().device == "metal", path.decide().reason
    n = (1 << 20) + 3
    a, b = torch.randn(n).to(dtype), torch.randn(n).to(dtype)
    want = a.clone()
    gate.cpu_reduce_(want, b, op)
    assert path.reduce_(a, b, op) == "metal"
    assert gate.first_difference(a, want) is None
