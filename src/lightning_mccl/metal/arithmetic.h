// The per-value arithmetic of the Metal kernels (kernels.metal), in one text that compiles both as the Metal
// Shading Language and as C++17: the 8-bit block format of csrc/engine/int8_blocks.h (its scale, codes,
// decoding and error feedback) and DiLoCo's outer step (src/lightning_mccl/diloco.py). Metal compiles it on the
// user's Mac at run time (torch.mps.compile_shader, so it ships in the package beside kernels.metal); the C++
// build is what tests/engine/test_metal_arithmetic.cc checks bit for bit against the engine's codec, and what
// the binding runs on CPU tensors as the kernels' reference (csrc/torch/metal_reference.cpp).
//
// Every step is an integer operation, an exact product, or one IEEE operation rounded to nearest; the few that
// could differ between compilers are spelled out: the scale's inverse comes from integer division (a device's
// float division need not be correctly rounded), codes round with rint (ties to even), and DiLoCo's products
// and sums are explicit fused multiply-adds (so that no compiler chooses whether to contract them). NaN and
// Inf are told apart on their bits, never with isnan, which a fast-math compile may fold away.
#pragma once

#ifdef __METAL_VERSION__
#define MCCL_THREAD thread  // a reference to a local value (Metal's address space; C++ has one)
namespace mccl_arith {
inline uint32_t f32_bits(float x) { return as_type<uint32_t>(x); }
inline float bits_f32(uint32_t u) { return as_type<float>(u); }
inline float round_even(float x) { return metal::rint(x); }
inline float fused(float a, float b, float c) { return metal::fma(a, b, c); }
}  // namespace mccl_arith
#else
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "float_bits.h"  // the engine's (csrc/engine): the C++ build is the repository's only
#define MCCL_THREAD
namespace mccl_arith {
using mccl::bits_f32;
using mccl::f32_bits;
inline float round_even(float x) { return std::nearbyint(x); }  // the default rounding mode: ties to even
inline float fused(float a, float b, float c) { return std::fma(a, b, c); }
}  // namespace mccl_arith
#endif

namespace mccl_arith {

enum : uint32_t {
  kBlock = 256,                  // values per block: its float32 scale, then one int8 code a value
  kRow = 4 + 256,                // a block's bytes (the last block of a buffer may have fewer codes)
  kAbsMask = 0x7FFFFFFFu,
  kSignBit = 0x80000000u,
  kInfBits = 0x7F800000u,        // also the exponent field
  kNaNBits = 0x7FC00000u,        // the one NaN decoding gives, on every device
  kMinScaledBits = 0x0D800000u,  // 2^-100: blocks whose largest magnitude is below it travel as zeros
  kScaleStep = 0x80u,            // one unit in the last of a scale's 17 significant bits
  kMaxScaleBits = 0x7C020800u,   // 0x1.041p+121, the largest 17-bit float s whose 126 s is finite
  kAbove126thBits = 0x3C020822u, // the float after fl(1/126)
};

// |x|'s bits where x is finite, else 0: a block's scale comes from its finite values only. Non-negative floats
// order as their bits, so the block's largest magnitude is the largest of these.
inline uint32_t finite_magnitude(float x) {
  const uint32_t a = f32_bits(x) & kAbsMask;
  return a < kInfBits ? a : 0u;
}

// The block's scale s from its largest finite magnitude M (finite_magnitude's bits): the least float with 17
// significant bits that is at least M / 126, at most kMaxScaleBits; 0 where M < 2^-100. M times a float just above
// 1/126, rounded up to 17 bits, is at least M / 126 and at most one step above s; 126 s is exact (6 + 17 bits),
// so one comparison decides between the two.
inline float int8_scale(uint32_t largest) {
  if (largest < kMinScaledBits) return 0.0f;
  const float m = bits_f32(largest);
  const uint32_t candidate = (f32_bits(m * bits_f32(kAbove126thBits)) + kScaleStep - 1u) & ~(kScaleStep - 1u);
  const uint32_t below = candidate - kScaleStep;
  const uint32_t s = bits_f32(below) * 126.0f >= m ? below : candidate;
  return bits_f32(s < kMaxScaleBits ? s : kMaxScaleBits);
}

// fl(1 / s), as the engine's correctly rounded division gives it (0 for s = 0), in integer arithmetic. s = m 2^e
// with m = 1 + k / 2^16, so 1 / s = (2^16 / (2^16 + k)) 2^-e: the quotient's 24 significant bits are
// q = 2^40 / (2^16 + k) rounded to nearest (never a tie: 2^41 has no odd divisor above 1), by long division in
// 8-bit steps, and 1 / m = q 2^-24 (k = 0: q = 2^24, 1); then the exponent field moves exactly (every 1 / s is
// a normal float).
inline float int8_inverse(float scale) {
  const uint32_t s = f32_bits(scale);
  if (s == 0u) return 0.0f;
  const uint32_t d = 0x10000u + ((s >> 7) & 0xFFFFu);
  uint32_t q = 0x1000000u / d, r = 0x1000000u % d;
  for (int digit = 0; digit < 2; ++digit) {
    const uint32_t n = r << 8;
    q = (q << 8) | (n / d);
    r = n % d;
  }
  q += 2u * r > d ? 1u : 0u;
  return bits_f32((125u << 23) + q + (127u << 23) - (s & kInfBits));  // q 2^-24 (in [1/2, 1]), then 2^-e
}

// The code of y in a block of scale s (inverse: int8_inverse(s)): y / s rounded to the nearest integer (ties to
// even) within -126..126; NaN -128, +Inf 127, -Inf -127.
inline int32_t int8_code(float y, float inverse) {
  const uint32_t bits = f32_bits(y), a = bits & kAbsMask;
  if (a > kInfBits) return -128;
  if (a == kInfBits) return (bits & kSignBit) != 0u ? -127 : 127;
  const float r = round_even(y * inverse);
  return r < -126.0f ? -126 : (r > 126.0f ? 126 : int32_t(r));
}

// The value a code stands for in a block of scale s.
inline float int8_value(int32_t code, float scale) {
  if (code == -128) return bits_f32(kNaNBits);
  if (code == 127) return bits_f32(kInfBits);
  if (code == -127) return bits_f32(kInfBits | kSignBit);
  return float(code) * scale;
}

// Error feedback: what encoding y as `code` lost, y - code s (one rounding: the product is exact, so fused or
// not gives the same bits), and 0 where y is not finite (a NaN or Inf travels as itself and must not come back
// in the next call).
inline float int8_lost(float y, int32_t code, float scale) {
  if ((f32_bits(y) & kAbsMask) >= kInfBits) return 0.0f;
  return y - float(code) * scale;
}

// base + the value of `code`: a decoded contribution added to a sum, NaN as int8_value's.
inline float int8_decode_add(float base, int32_t code, float scale) {
  const float sum = base + int8_value(code, scale);
  return (f32_bits(sum) & kAbsMask) > kInfBits ? bits_f32(kNaNBits) : sum;
}

// DiLoCo's pseudo-gradient of one value: the anchor minus this rank's weight.
inline float diloco_pseudo_gradient(float anchor, float weight) { return anchor - weight; }

// DiLoCo's outer step on one value (diloco.py's _apply), with the products and sums fused:
//   momentum = mu momentum + mean;  u = lr (mean + mu momentum);  anchor -= u;  own -= u
// where mean is the ranks' average pseudo-gradient and own this rank's, which becomes the correction its weight
// takes (w += own - u puts it at the new anchor plus what it learnt since the round's end).
inline void diloco_outer_step(float mean, MCCL_THREAD float& momentum, MCCL_THREAD float& anchor,
                              MCCL_THREAD float& own, float lr, float mu) {
  momentum = fused(mu, momentum, mean);
  const float u = fused(mu, momentum, mean) * lr;
  anchor = anchor - u;
  own = own - u;
}

#ifndef __METAL_VERSION__
// The kernels' work on a CPU, one value after another (kernels.metal shares each block among a SIMD group's
// threads): what tests/engine/test_metal_arithmetic.cc checks against the engine's codec, and what the binding
// runs on CPU tensors as the kernels' reference (csrc/torch/metal_reference.cpp). `blocks` holds kRow bytes a
// block; its first int8_wire_bytes(count) bytes are the wire form of `count` values (int8_blocks.h).

// values (+ residual, when not null) encoded into blocks; residual then holds what the encoding lost.
inline void encode_on_cpu(const float* values, float* residual, unsigned char* blocks, size_t count) {
  for (size_t first = 0; first < count; first += kBlock) {
    const size_t n = count - first < kBlock ? count - first : size_t(kBlock);
    float y[kBlock];
    uint32_t largest = 0;
    for (size_t i = 0; i < n; ++i) {
      y[i] = residual ? values[first + i] + residual[first + i] : values[first + i];
      largest = finite_magnitude(y[i]) > largest ? finite_magnitude(y[i]) : largest;
    }
    const float scale = int8_scale(largest), inverse = int8_inverse(scale);
    unsigned char* row = blocks + first / kBlock * kRow;
    std::memcpy(row, &scale, sizeof scale);
    for (size_t i = 0; i < n; ++i) {
      const int32_t code = int8_code(y[i], inverse);
      row[4 + i] = static_cast<unsigned char>(code);
      if (residual) residual[first + i] = int8_lost(y[i], code, scale);
    }
  }
}

// The values of blocks into out, or added to it (`add`).
inline void decode_on_cpu(const unsigned char* blocks, float* out, size_t count, bool add) {
  for (size_t i = 0; i < count; ++i) {
    const unsigned char* row = blocks + i / kBlock * kRow;
    float scale;
    std::memcpy(&scale, row, sizeof scale);
    const int32_t code = static_cast<signed char>(row[4 + i % kBlock]);
    out[i] = add ? int8_decode_add(out[i], code, scale) : int8_value(code, scale);
  }
}
#endif

}  // namespace mccl_arith
