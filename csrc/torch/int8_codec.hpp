// The 8-bit format (csrc/engine/int8_blocks.h) in torch ops, on the tensor's own device: how an accelerator's
// gradients reach the 8-bit allreduce a quarter of their size, with this rank's per-value work (error feedback,
// encoding, decoding) done where they are (docs/int8.md). Plain ATen ops that CUDA, MPS and the CPU all have, on
// the current stream; the same bytes as the engine's encoder, bit for bit (tests/torch/test_int8_codec.py).
#pragma once

#include <ATen/ATen.h>

namespace lightning_mccl {

// Values in blocks of kInt8Block (a float32 scale, then one int8 code per value), one block per row of a uint8
// tensor [blocks, 4 + kInt8Block]: its first int8_wire_bytes(count) bytes are the wire form of `count` values
// (the last block's padding comes last), which is what the engine reads and writes.
//
// The wire form of `values` (float32, contiguous) plus `residual` (undefined, or float32 of as many elements on
// the same device, contiguous), which is then set to what that encoding loses (0 where the sum is not finite).
at::Tensor int8_encode_blocks(const at::Tensor& values, const at::Tensor& residual);
// The `count` values of `blocks` (int8_encode_blocks' layout), into `out` (float32, contiguous, count elements).
void int8_decode_blocks(const at::Tensor& blocks, const at::Tensor& out);
// The first bytes of `blocks` that the engine sends and receives: int8_wire_bytes(count).
at::Tensor int8_wire_view(const at::Tensor& blocks, int64_t count);

}  // namespace lightning_mccl
