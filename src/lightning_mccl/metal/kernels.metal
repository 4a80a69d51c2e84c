// The Metal kernels of the 8-bit allreduce's and DiLoCo's per-value work on MPS tensors, each one pass over
// memory (docs/int8.md, *What runs where*). lightning_mccl.metal compiles this text with torch.mps.compile_shader
// on first use, the line that includes arithmetic.h replaced by that header's text; each argument is a tensor's
// buffer or, for a Python int or float, a `constant long&` or `constant float&`, in the order given.
#include <metal_stdlib>
using namespace metal;
#include "arithmetic.h"

using namespace mccl_arith;

constant constexpr uint kLanes = 32;                // a SIMD group: one block of 256 values,
constant constexpr uint kPerLane = kBlock / kLanes;  // 8 a thread, lane + 32 k (adjacent threads, adjacent values)

// Error feedback and encoding, in one pass: y = values (+ residual, when `feedback`) is encoded into `blocks`
// (kRow bytes a block: its scale, then its codes; the last block's codes may stop short) and `residual` left
// holding what the encoding lost. A SIMD group encodes a block; threads: 32 a block, in threadgroups of a
// multiple of 32. Without feedback, `residual` is any buffer (unread, unwritten).
kernel void int8_encode(device const float* values [[buffer(0)]], device float* residual [[buffer(1)]],
                        device uint8_t* blocks [[buffer(2)]], constant long& count [[buffer(3)]],
                        constant long& feedback [[buffer(4)]], uint thread_id [[thread_position_in_grid]],
                        uint lane [[thread_index_in_simdgroup]]) {
  const ulong first = ulong(thread_id / kLanes) * kBlock;
  float y[kPerLane];
  uint32_t largest = 0;
  for (uint k = 0; k < kPerLane; ++k) {
    const ulong i = first + lane + k * kLanes;
    y[k] = 0.0f;
    if (i < ulong(count)) y[k] = feedback != 0 ? values[i] + residual[i] : values[i];
    largest = max(largest, finite_magnitude(y[k]));
  }
  largest = simd_max(largest);
  const float scale = int8_scale(largest), inverse = int8_inverse(scale);
  device uint8_t* row = blocks + first / kBlock * kRow;
  if (lane == 0) {
    const uint32_t s = as_type<uint32_t>(scale);
    for (uint b = 0; b < 4; ++b) row[b] = uint8_t(s >> (8 * b));  // little-endian, as the wire has it
  }
  for (uint k = 0; k < kPerLane; ++k) {
    const ulong i = first + lane + k * kLanes;
    if (i >= ulong(count)) break;
    const int32_t code = int8_code(y[k], inverse);
    row[4 + lane + k * kLanes] = uint8_t(code & 0xFF);
    if (feedback != 0) residual[i] = int8_lost(y[k], code, scale);
  }
}

// The values of `blocks` written into `out` (add == 0) or added to it; a thread a value.
kernel void int8_decode(device const uint8_t* blocks [[buffer(0)]], device float* out [[buffer(1)]],
                        constant long& add [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  device const uint8_t* row = blocks + ulong(i / kBlock) * kRow;
  const float scale = as_type<float>(uint32_t(row[0]) | uint32_t(row[1]) << 8 | uint32_t(row[2]) << 16 |
                                     uint32_t(row[3]) << 24);
  const int32_t code = int32_t(as_type<int8_t>(row[4 + i % kBlock]));
  out[i] = add != 0 ? int8_decode_add(out[i], code, scale) : int8_value(code, scale);
}

// DiLoCo's pseudo-gradient: `flat` holds this rank's weights and becomes anchor - weights, as does `own`.
kernel void pseudo_gradient(device const float* anchor [[buffer(0)]], device float* flat [[buffer(1)]],
                            device float* own [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  const float delta = diloco_pseudo_gradient(anchor[i], flat[i]);
  flat[i] = delta;
  own[i] = delta;
}

// DiLoCo's outer step (arithmetic.h): `mean` the ranks' average pseudo-gradient; `momentum` and `anchor` updated;
// `own`, this rank's pseudo-gradient, becomes the correction its weights take.
kernel void outer_step(device const float* mean [[buffer(0)]], device float* momentum [[buffer(1)]],
                       device float* anchor [[buffer(2)]], device float* own [[buffer(3)]],
                       constant float& lr [[buffer(4)]], constant float& mu [[buffer(5)]],
                       uint i [[thread_position_in_grid]]) {
  float m = momentum[i], a = anchor[i], o = own[i];
  diloco_outer_step(mean[i], m, a, o, lr, mu);
  momentum[i] = m;
  anchor[i] = a;
  own[i] = o;
}
