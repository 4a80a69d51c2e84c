"""The 8-bit format's two codecs (docs/int8.md): torch ops on a tensor's device (csrc/torch/int8_codec.cpp, what
the 8-bit allreduce runs on an accelerator) against the engine's vector code (csrc/engine/int8_blocks.cc, what it
runs for a CPU tensor), bit for bit: the bytes of the encoding, the residual error feedback leaves, and the
decoded values (NaN's bits too), on values of every kind (NaN, Inf, zeros, denormals, blocks too small to scale,
the largest floats) and sizes that are not a multiple of the 256-value block. On the CPU here; on CUDA too where
there is a device (the GPU host)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_mccl.backend import extension as _C

SIZES = [1, 255, 256, 257, 5000, 70001]


def _cuda() -> bool:
    return torch.cuda.is_available()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _cuda(), reason="no CUDA device (the GPU host "
                                                                                     "runs it)"))]


def codec_cases(count: int, seed: int) -> np.ndarray:
    """Block magnitudes over 2^-140..2^120; blocks whose largest magnitude is 126 times a 17-bit float, or a float
    either side of that (where a rounded quotient and the exact one part); and every special value the format
    has a rule for."""
    rng = np.random.default_rng(seed)
    exponents = np.repeat(rng.integers(-140, 120, size=count // 256 + 1), 256)[:count]
    x = (rng.standard_normal(count) * np.exp2(exponents.astype(np.float64))).astype(np.float32)
    for first in range(0, count, 3 * 256):  # one block in three: its largest value set so
        g = np.float32(np.ldexp(float(rng.integers(1 << 16, 1 << 17)), int(exponents[first]) - 19))
        exact = g * np.float32(126)  # 17 + 6 bits: exact
        x[first] = [exact, np.nextafter(exact, np.float32(0)), np.nextafter(exact, np.float32(np.inf))][first // 768 % 3]
    bits = x.view(np.uint32)
    special = {0: 0x7FC00000, 1: 0xFFC00000, 2: 0x7F800001, 3: 0x7F800000, 4: 0xFF800000, 5: 0x00000000,
               6: 0x80000000, 7: 0x00000001, 8: 0x807FFFFF, 9: 0x7F7FFFFF, 10: 0xFF7FFFFF, 11: 0x0B800000}
    for k, b in special.items():  # NaNs (quiet, negative, signalling), Infs, zeros, denormals, the largest, 2^-104
        if 1 + k * 37 < count:
            bits[1 + k * 37] = b
    return x


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().view(torch.int32).numpy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count", SIZES)
def test_torch_ops_encode_and_decode_as_the_engine_does(count, device):
    x = torch.from_numpy(codec_cases(count, count))
    wire = _C.int8_encode(x, engine=True)
    on_device = _C.int8_encode(x.to(device))
    assert on_device.device.type == device and on_device.numel() == wire.numel()
    assert torch.equal(on_device.cpu(), wire), f"{count} values: the encodings differ"
    back = _C.int8_decode(wire, count, engine=True)
    assert np.array_equal(_bits(_C.int8_decode(wire.to(device), count)), _bits(back)), "the decodings differ"
    finite = torch.isfinite(x)
    assert torch.equal(torch.isnan(back), torch.isnan(x)) and torch.equal(back[~finite & ~torch.isnan(x)],
                                                                          x[~finite & ~torch.isnan(x)])
    assert (back[finite] - x[finite]).abs().max() <= x[finite].abs().max() / 252 * 1.0001


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count", [257, 70001, 65536])
def test_error_feedback_leaves_the_same_residual(count, device):
    x = torch.from_numpy(codec_cases(count, 7 + count))
    residual = torch.from_numpy(codec_cases(count, 8 + count)) * 1e-3
    kept = residual.clone()
    wire = _C.int8_encode(x, kept, engine=True)
    on_device = residual.clone().to(device)
    assert torch.equal(_C.int8_encode(x.to(device), on_device).cpu(), wire), "the encodings differ"
    assert np.array_equal(_bits(on_device), _bits(kept)), "the residuals differ"
    total = x + residual
    lost = total - _C.int8_decode(wire, count, engine=True)
    assert torch.equal(kept, torch.where(torch.isfinite(total), lost, 0.0))  # what the encoding lost, 0 for NaN/Inf


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count", SIZES)
def test_the_metal_kernels_arithmetic_encodes_and_decodes_as_the_device_codec(count, device):
    """arithmetic.h built as C++ (_C.metal_reference: what Metal runs, compiled by the host's compiler) against
    the torch ops on `device`: the bytes, the residual and the decoded bits (tests/engine/test_metal_arithmetic.cc
    checks the same header against the engine)."""
    from lightning_mccl import metal

    x = torch.from_numpy(codec_cases(count, count))
    residual = torch.from_numpy(codec_cases(count, 8 + count)) * 1e-3
    blocks = torch.empty((count + metal.BLOCK - 1) // metal.BLOCK * metal.ROW, dtype=torch.uint8)
    kept = residual.clone()
    _C.metal_reference.int8_encode(x, kept, blocks, count, 1)
    on_device = residual.clone().to(device)
    wire = _C.int8_encode(x.to(device), on_device).cpu()
    assert torch.equal(blocks[:wire.numel()], wire), f"{count} values: the encodings differ"
    assert np.array_equal(_bits(on_device), _bits(kept)), "the residuals differ"
    decoded = torch.empty(count)
    _C.metal_reference.int8_decode(blocks, decoded, 0)
    assert np.array_equal(_bits(decoded), _bits(_C.int8_decode(wire.to(device), count))), "the decodings differ"
