"""lightning_mccl.metal's Python side, with a stand-in for torch.mps.compile_shader (metal_standin.py: the kernels'
arithmetic compiled as C++, run on CPU tensors; no Metal runs here, tests/torch/test_metal_kernels.py is for a
Mac): the choice each group makes when it is made, the same on every rank (all use the kernels, or none does);
the fallback's one line naming the rank and its reason (MCCL_METAL=off, a self-test that finds a kernel
miscomputing, no MPS device); the 8-bit allreduce through the encoded path (ProcessGroupMCCL.
allreduce_int8_encoded) giving the engine codec's bits, results and residuals; a failing decode failing the
Work; and the self-test, the source and the DiLoCo kernels on their own."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from lightning_mccl.testing import backend_name, run_ranks
from metal_standin import KERNELS, StandInCompiler, install

pytestmark = pytest.mark.skipif(backend_name() != "mccl", reason="lightning_mccl.metal gates mccl groups")


class _Lines(logging.Handler):
    """The lines lightning_mccl.metal logs in a rank, with their levels."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines = []
        logger = logging.getLogger("lightning_mccl.metal")
        logger.setLevel(logging.INFO)
        logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))

    def take(self) -> list:
        lines, self.lines = self.lines, []
        return lines


def _values(rank: int, count: int = 3000) -> torch.Tensor:
    g = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(count, generator=g) * torch.exp2(torch.randint(-8, 8, (count,), generator=g).float())
    x[7 + rank] = float("inf") if rank == 1 else x[7 + rank]
    return x


def _int8_both_ways(group, rank: int, steps: int = 3) -> dict:
    """int8.all_reduce of the same values with codec="torch" (on a CPU tensor: the kernels, where the group chose
    them) and codec="engine", `steps` times with error feedback each: every result and residual, per codec."""
    from lightning_mccl import int8

    out = {"torch": [], "engine": [], "torch_residual": None, "engine_residual": None, "future_is_tensor": True}
    feedback = {codec: int8.ErrorFeedback() for codec in ("torch", "engine")}
    for _ in range(steps):
        for codec in ("torch", "engine"):
            x = _values(rank)
            residual = feedback[codec].residual("x", x, int8.residual_device(x, codec))
            work = int8.all_reduce(x, residual, "avg", group, codec)
            value = work.get_future().wait()
            out["future_is_tensor"] &= value[0] is x
            out[codec].append(x.clone())
            out[f"{codec}_residual"] = residual.clone()
    return out


def _metal_worker(rank, world):
    import torch.distributed as dist

    from lightning_mccl import int8
    from lightning_mccl.backend import mccl_backend

    lines = _Lines()
    standin = install(StandInCompiler())
    group = dist.new_group(backend="mccl")
    out = {"choice": mccl_backend(group).device_kernels, "lines": lines.take(), "compiled": standin.compiled}
    out.update(_int8_both_ways(group, rank))
    out["calls"] = dict(standin.calls)
    # A decode that raises fails the Work with its message (every rank's does).
    install(StandInCompiler(fail="int8_decode"))
    try:
        int8.all_reduce(_values(rank), None, "sum", group, "torch").wait()
        out["decode_error"] = None
    except RuntimeError as e:
        out["decode_error"] = str(e)
    return out


def test_every_rank_takes_the_kernels_and_the_8_bit_allreduce_gives_the_engines_bits():
    world = 3
    results = run_ranks(_metal_worker, world, timeout=120)
    for r, res in enumerate(results):
        assert res["choice"] == "metal", f"rank {r}: {res['choice']}"
        assert res["compiled"] == 1
        assert res["calls"]["int8_encode"] >= 3 and res["calls"]["int8_decode"] >= 3, res["calls"]  # the path ran
        assert res["future_is_tensor"]
        for step, (a, b) in enumerate(zip(res["torch"], res["engine"])):
            assert np.array_equal(a.view(np.int32), b.view(np.int32)), f"rank {r}, step {step}: results differ"
            assert np.array_equal(a.view(np.int32), results[0]["torch"][step].view(np.int32)), "ranks differ"
        assert np.array_equal(res["torch_residual"].view(np.int32), res["engine_residual"].view(np.int32))
        assert res["decode_error"] is not None and "decode() raised" in res["decode_error"] \
            and "stand-in: int8_decode fails" in res["decode_error"], res["decode_error"]
    # The average, within the 8-bit bound of the ranks' mean (the infinity of rank 1 travels as itself).
    exact = sum(_values(r).double().numpy() for r in range(world)) / world
    finite = np.isfinite(exact)
    got = results[0]["torch"][0].astype(np.float64)
    assert np.isinf(got[8]) and np.all(np.abs(got[finite] - exact[finite]) <= np.abs(exact[finite]).max() / 126 * 2)
    assert results[0]["lines"] == [("INFO", "lightning_mccl: the per-value work of MPS tensors (8-bit allreduce, "
                                            "DiLoCo) on this group of 3 ranks runs in Metal kernels, self-tested on "
                                            "every rank")]
    assert all(res["lines"] == [] for res in results[1:])


def _fallback_worker(rank, world):
    import os

    import torch.distributed as dist

    from lightning_mccl import metal
    from lightning_mccl.backend import mccl_backend

    lines = _Lines()
    out = {}
    standin = install(StandInCompiler())
    if rank == 1:
        os.environ["MCCL_METAL"] = "off"
    group = dist.new_group(backend="mccl")
    os.environ.pop("MCCL_METAL", None)
    out["off"] = {"choice": mccl_backend(group).device_kernels, "lines": lines.take()}
    out["off"].update(_int8_both_ways(group, rank, steps=1))
    out["off"]["calls"] = dict(standin.calls)  # the self-test's only: all_reduce took torch ops
    install(StandInCompiler(corrupt="int8_encode" if rank == 2 else None))
    group = dist.new_group(backend="mccl")
    out["miscomputes"] = {"choice": mccl_backend(group).device_kernels, "lines": lines.take()}
    metal.COMPILER = metal.Compiler()  # torch.mps.compile_shader: no MPS device here
    group = dist.new_group(backend="mccl")
    out["no_device"] = {"choice": mccl_backend(group).device_kernels, "lines": lines.take()}
    os.environ["MCCL_METAL"] = "yes"
    try:
        dist.new_group(backend="mccl")
        out["bad_setting"] = None
    except ValueError as e:
        out["bad_setting"] = str(e)
    return out


def test_one_rank_that_cannot_sends_every_rank_to_torch_ops_with_one_line_naming_it():
    results = run_ranks(_fallback_worker, 3, timeout=120)
    off = "torch ops: rank 1: MCCL_METAL=off"
    miscomputes = ("torch ops: rank 2: self-test: int8_encode's bytes (with error feedback) differ from the CPU's "
                   "at element 9 of 884")
    for r, res in enumerate(results):
        assert res["off"]["choice"] == off and res["miscomputes"]["choice"] == miscomputes, (r, res)
        assert res["no_device"]["choice"] == "torch ops: rank 0: no MPS device"
        assert res["off"]["calls"].get("int8_decode", 0) == (0 if r == 1 else 2), res["off"]["calls"]  # self-tests
        assert np.array_equal(res["off"]["torch"][0].view(np.int32), res["off"]["engine"][0].view(np.int32))
        assert res["bad_setting"] == "MCCL_METAL='yes': expected auto or off (default auto)"
        if r:
            assert all(not res[g]["lines"] for g in ("off", "miscomputes", "no_device")), res
    prefix = ("lightning_mccl: the per-value work of MPS tensors (8-bit allreduce, DiLoCo) on this group of 3 ranks "
              "runs in ")
    assert results[0]["off"]["lines"] == [("WARNING", prefix + off)]
    assert results[0]["miscomputes"]["lines"] == [("WARNING", prefix + miscomputes)]
    assert results[0]["no_device"]["lines"] == []  # no rank could have: nothing to say


# -- without processes ----------------------------------------------------------------------------------------

def test_the_source_embeds_the_arithmetic_once_and_defines_every_kernel():
    from lightning_mccl import metal

    text = metal.source()
    assert text.count("inline float int8_scale(") == 1 and '#include "arithmetic.h"' not in text
    assert all(f"kernel void {name}(" in text for name in KERNELS)


def test_the_setting_takes_auto_and_off():
    from lightning_mccl import metal

    assert metal.setting({}) == metal.setting({"MCCL_METAL": " AUTO "}) == "auto"
    assert metal.setting({"MCCL_METAL": "off"}) == "off"
    with pytest.raises(ValueError, match=r"^MCCL_METAL='1': expected auto or off \(default auto\)$"):
        metal.setting({"MCCL_METAL": "1"})


@pytest.mark.parametrize("kernel, what", [("int8_encode", "int8_encode's bytes (with error feedback)"),
                                          ("int8_decode", "int8_decode's values"),
                                          ("pseudo_gradient", "pseudo_gradient's values"),
                                          ("outer_step", "outer_step's momentum")])
def test_the_self_test_names_the_kernel_that_miscomputes(kernel, what):
    from lightning_mccl import metal

    assert metal.self_test(metal._compiled(StandInCompiler())) is None
    found = metal.self_test(metal._compiled(StandInCompiler(corrupt=kernel)))
    assert found == f"{what} differ from the CPU's at element 9 of {884 if kernel == 'int8_encode' else 868}"


def test_describe_says_which_path_this_process_takes(monkeypatch):
    from lightning_mccl import metal

    monkeypatch.delenv("MCCL_METAL", raising=False)
    expected = "torch ops: no MPS device" if not torch.backends.mps.is_available() else None
    if expected:
        assert metal.describe() == expected
    monkeypatch.setattr(metal, "COMPILER", StandInCompiler())
    assert metal.describe() == "Metal kernels (self-tested against the CPU codec)"
    monkeypatch.setenv("MCCL_METAL", "off")
    assert metal.describe() == "torch ops: MCCL_METAL=off"


def test_the_diloco_kernels_take_the_outer_step_of_diloco_py():
    """pseudo_gradient and outer_step against diloco.py's torch ops: the same bits with the defaults (lr 1, mu 0),
    within a rounding with Nesterov momentum (the kernels fuse each product with its sum)."""
    from lightning_mccl import metal

    k = metal._compiled(StandInCompiler())
    g = torch.Generator().manual_seed(5)
    anchor, w, mean, momentum = (torch.randn(1000, generator=g) for _ in range(4))
    flat, own = w.clone(), torch.empty(1000)
    k.pseudo_gradient(anchor, flat, own)
    assert torch.equal(flat, anchor - w) and torch.equal(own, anchor - w)
    for lr, mu in ((1.0, 0.0), (0.7, 0.9)):
        m, a, o = momentum.clone(), anchor.clone(), own.clone()
        k.outer_step(mean, m, a, o, lr, mu)
        want_m = momentum.clone().mul_(mu).add_(mean)  # diloco.py's _apply
        step = mean.clone().add_(want_m, alpha=mu).mul_(lr)
        exact = mu == 0.0
        for got, want in ((m, want_m), (a, anchor - step), (o, own - step)):
            assert torch.equal(got, want) if exact else torch.allclose(got, want, rtol=1e-6, atol=1e-6)
