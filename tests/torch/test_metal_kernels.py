"""The Metal kernels (src/lightning_mccl/metal) on a Mac's GPU, compiled by torch.mps.compile_shader, against the
CPU: the engine's codec for the 8-bit format (the bytes, the residual, the decoded values, on the cases of
tests/torch/test_int8_codec.py), their arithmetic's C++ build (`_C.metal_reference`) for decode-and-add and
DiLoCo's kernels; the self-test a group runs when it is made; and the 8-bit allreduce of MPS tensors through them
at 2 ranks, equal to the engine's. Written for the day a Mac runs it: it has not run (no Mac here), and is
listed so in the README's *Verified on*.

A device that flushes denormals to zero may give 0 where the CPU gives a denormal residual or sum (never a
different code or decoded value): that, and only that, is allowed."""
import numpy as np
import pytest
import torch

from lightning_mccl.testing import run_ranks

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(),
                                reason="needs Apple silicon with MPS (runs in .github/workflows/macos.yml)")

SIZES = [1, 255, 256, 257, 5000, 70001, 1_000_003]
TINY = 2.0 ** -126  # below it: a denormal (or zero)


def _kernels():
    from lightning_mccl import metal

    return metal._compiled(metal.COMPILER)


def _cases(count, seed):
    from test_int8_codec import codec_cases  # the same cases as the device codec's tests

    return torch.from_numpy(codec_cases(count, seed))


def _same_or_flushed(got, want):
    """Bit for bit, except a denormal the device may have made 0."""
    got, want = got.detach().cpu(), want.detach().cpu()
    same = got.view(torch.int32) == want.view(torch.int32)
    flushed = (want.abs() < TINY) & (got == 0)
    return bool((same | flushed).all()), int((~same).sum())


@pytest.mark.parametrize("count", SIZES)
def test_encode_and_decode_give_the_engines_bits(count):
    from lightning_mccl.backend import extension as _C

    k, mps = _kernels(), torch.device("mps")
    x = _cases(count, count)
    residual = _cases(count, 8 + count) * 1e-3
    on_device = residual.to(mps)
    blocks = k.encode(x.to(mps), on_device)
    wire = _C.int8_encode(x, residual, engine=True)
    assert torch.equal(blocks.reshape(-1)[:wire.numel()].cpu(), wire), f"{count} values: the encodings differ"
    ok, differ = _same_or_flushed(on_device, residual)
    assert ok, f"{count} values: {differ} residuals differ (beyond flushed denormals)"
    assert torch.equal(k.encode(x.to(mps), None).reshape(-1)[:wire.numel()].cpu(), _C.int8_encode(x, engine=True))
    decoded = torch.empty(count, device=mps)
    k.decode(blocks, decoded)
    want = _C.int8_decode(wire, count, engine=True)
    assert torch.equal(decoded.cpu().view(torch.int32), want.view(torch.int32)), "the decodings differ"
    base = _cases(count, 9 + count)
    summed = base.to(mps)
    k.decode(blocks, summed, add=True)
    _C.metal_reference.int8_decode(blocks.cpu(), base, 1)
    ok, differ = _same_or_flushed(summed, base)
    assert ok, f"{count} values: {differ} decoded-and-added values differ"


def test_the_diloco_kernels_give_their_arithmetics_bits():
    from lightning_mccl.backend import extension as _C

    k, mps = _kernels(), torch.device("mps")
    g = torch.Generator().manual_seed(3)
    anchor, w, mean, momentum = (torch.randn(1_000_003, generator=g) for _ in range(4))
    d = [t.to(mps) for t in (anchor, w, mean, momentum)]
    d_own, own = torch.empty_like(d[0]), torch.empty_like(anchor)
    k.pseudo_gradient(d[0], d[1], d_own)
    _C.metal_reference.pseudo_gradient(anchor, w, own)
    assert torch.equal(d_own.cpu(), own) and torch.equal(d[1].cpu(), w)
    k.outer_step(d[2], d[3], d[0], d_own, 0.7, 0.9)
    _C.metal_reference.outer_step(mean, momentum, anchor, own, 0.7, 0.9)
    for got, want in ((d[3], momentum), (d[0], anchor), (d_own, own)):
        assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))


def test_the_self_test_passes_on_this_mac():
    from lightning_mccl import metal

    assert metal.self_test(_kernels()) is None
    assert metal.describe() == "Metal kernels (self-tested against the CPU codec)"


def _allreduce_on_mps(rank, world):
    from lightning_mccl import int8
    from lightning_mccl.backend import mccl_backend

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(300_001, generator=g)
    results = {"choice": mccl_backend(None).device_kernels}
    for codec, device in (("auto", "mps"), ("engine", "cpu")):
        feedback = int8.ErrorFeedback()
        for _ in range(2):  # the second adds the first's residual
            t = x.to(device, copy=True)
            int8.all_reduce(t, feedback.residual("x", t, int8.residual_device(t, codec)), "avg", codec=codec).wait()
        results[codec] = t.cpu()
        results[f"{codec}_residual"] = feedback.residual("x", t, int8.residual_device(t, codec)).cpu()
    return results


def test_the_8_bit_allreduce_of_mps_tensors_takes_the_kernels_and_gives_the_engines_bits():
    results = run_ranks(_allreduce_on_mps, 2, timeout=180)
    for r, res in enumerate(results):
        assert res["choice"] == "metal", f"rank {r}: {res['choice']}"
        assert np.array_equal(res["auto"].view(np.int32), res["engine"].view(np.int32)), f"rank {r}: results differ"
        assert np.array_equal(res["auto"].view(np.int32), results[0]["auto"].view(np.int32)), "ranks differ"
        assert np.array_equal(res["auto_residual"].view(np.int32), res["engine_residual"].view(np.int32))
