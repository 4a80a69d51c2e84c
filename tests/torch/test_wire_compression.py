"""MCCL_WIRE_DTYPE through torch.distributed: float32 collectives travel as bf16/fp16, every rank ends with
the same bits, the error stays within the documented bound of a float64 reference, other dtypes are
untouched, and a bad setting is a ValueError naming the variable."""
from __future__ import annotations

import numpy as np
import pytest

from lightning_mccl.testing import run_ranks

WORLD = 3
COUNT = 200_000  # 800 KB, above the recursive-doubling limit for 3 ranks (512 KiB): the ring runs
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}


def rank_values(rank: int, count: int) -> np.ndarray:
    return np.random.default_rng(100 + rank).uniform(-4.0, 4.0, count)


def _allreduce_both_dtypes(rank, world, count):
    import torch
    import torch.distributed as dist

    out = {}
    for dtype in (torch.float32, torch.float64):
        t = torch.from_numpy(rank_values(rank, count)).to(dtype)
        dist.all_reduce(t)
        out[str(dtype)] = t.numpy()
    small = torch.from_numpy(rank_values(rank, 16)).float()  # recursive doubling
    dist.all_reduce(small)
    out["small"] = small.numpy()
    return out


@pytest.mark.parametrize("wire", ["bf16", "fp16"])
def test_compressed_float32_allreduce_is_bounded_and_identical(wire):
    results = run_ranks(_allreduce_both_dtypes, WORLD, args=(COUNT,), env={"MCCL_WIRE_DTYPE": wire}, timeout=90)
    u = UNIT_ROUNDOFF[wire]
    for key, count in (("torch.float32", COUNT), ("small", 16)):
        exact = sum(rank_values(r, count) for r in range(WORLD))
        magnitude = sum(np.abs(rank_values(r, count)) for r in range(WORLD))
        got = results[0][key].astype(np.float64)
        for r in range(1, WORLD):
            assert np.array_equal(results[r][key], results[0][key]), f"{key}: rank {r} differs from rank 0"
        assert np.all(np.abs(got - exact) <= (WORLD + 1) * u * magnitude), f"{key}: error above the bound"
        # Compression really happened: the float32 error is far above float32 rounding.
        assert np.max(np.abs(got - exact)) > 100 * 2.0**-24 * np.max(magnitude), f"{key}: looks uncompressed"
    exact64 = sum(rank_values(r, COUNT) for r in range(WORLD))
    np.testing.assert_allclose(results[0]["torch.float64"], exact64, rtol=1e-12, atol=1e-12)


def _init_only(rank, world):
    return "initialised"


def test_bad_wire_dtype_is_a_value_error_naming_the_variable():
    with pytest.raises(AssertionError) as failure:
        run_ranks(_init_only, 2, env={"MCCL_WIRE_DTYPE": "int8"}, timeout=60)
    assert "ValueError" in str(failure.value)
    assert "MCCL_WIRE_DTYPE='int8' is not one of off, bf16, fp16" in str(failure.value)
