// The Metal kernels (src/lightning_mccl/metal/kernels.metal) on CPU tensors, through the C++ build of their
// arithmetic (arithmetic.h): lightning_mccl.metal's self-test compares what Metal computes with these (and with
// the engine's codec), and the tests' stand-in for torch.mps.compile_shader runs them in Metal's place. Each takes
// its kernel's arguments, in the kernel's order.
#pragma once

#include <ATen/ATen.h>

namespace lightning_mccl::metal_reference {

// values (+ residual, with `feedback`) encoded into blocks (uint8, 260 bytes a block); residual then holds what
// the encoding lost.
void int8_encode(const at::Tensor& values, const at::Tensor& residual, const at::Tensor& blocks, int64_t count,
                 int64_t feedback);
// The values of blocks written into out (add == 0) or added to it.
void int8_decode(const at::Tensor& blocks, const at::Tensor& out, int64_t add);
// DiLoCo: flat (this rank's weights) and own become anchor - flat.
void pseudo_gradient(const at::Tensor& anchor, const at::Tensor& flat, const at::Tensor& own);
// DiLoCo's outer step: momentum and anchor updated, own becomes the correction of this rank's weights.
void outer_step(const at::Tensor& mean, const at::Tensor& momentum, const at::Tensor& anchor, const at::Tensor& own,
                double lr, double mu);

}  // namespace lightning_mccl::metal_reference
