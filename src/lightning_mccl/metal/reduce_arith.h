// The element arithmetic of the Metal reduction kernels, in the common subset of C++17 and the Metal
// Shading Language (MSL). lightning_mccl.metal compiles this file at run time, with its kernels appended,
// through torch.mps.compile_shader; tests/engine/test_metal_arith.cc compiles the same lines as C++ and
// checks them bit-for-bit against the engine's CPU reducer (csrc/engine/reduce.cc).
//
// Ops: SUM (AVG reduces like SUM; the division stays on the CPU), PRODUCT, MIN, MAX; float32, float16 and
// bfloat16. Half types compute in float32 and round back to nearest even, like the CPU reducer. The
// conversions use integer operations only, so a GPU that flushes float32 subnormals in arithmetic still
// converts exactly. MIN/MAX return a NaN operand if there is one.
// An include guard, not #pragma once: as Metal source this file is the main file (clang warns there).
#ifndef MCCL_REDUCE_ARITH_H
#define MCCL_REDUCE_ARITH_H

#if defined(__METAL_VERSION__)
#include <metal_stdlib>
using namespace metal;
typedef uint mccl_u32;
typedef ushort mccl_u16;
inline float mccl_as_float(mccl_u32 u) { return as_type<float>(u); }
inline mccl_u32 mccl_as_bits(float f) { return as_type<mccl_u32>(f); }
#else
#include <cstdint>
#include <cstring>
typedef uint32_t mccl_u32;
typedef uint16_t mccl_u16;
inline float mccl_as_float(mccl_u32 u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline mccl_u32 mccl_as_bits(float f) {
  mccl_u32 u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
#endif

// The op codes the kernels are specialised on (lightning_mccl/metal/kernels.py names them).
#define MCCL_OP_SUM 0
#define MCCL_OP_PRODUCT 1
#define MCCL_OP_MIN 2
#define MCCL_OP_MAX 3

inline float mccl_apply(int op, float a, float b) {
  if (op == MCCL_OP_SUM) return a + b;
  if (op == MCCL_OP_PRODUCT) return a * b;
  if (op == MCCL_OP_MIN) return ((a < b) || (a != a)) ? a : b;
  return ((a > b) || (a != a)) ? a : b;
}

// float16 -> float32, exact. Inf and NaN keep their payload; subnormals are normalised.
inline float mccl_f16_to_f32(mccl_u16 h) {
  mccl_u32 sign = (mccl_u32(h) & 0x8000u) << 16;
  mccl_u32 e = (mccl_u32(h) >> 10) & 0x1Fu;
  mccl_u32 m = mccl_u32(h) & 0x3FFu;
  if (e == 0x1Fu) return mccl_as_float(sign | 0x7F800000u | (m << 13));
  if (e != 0u) return mccl_as_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0u) return mccl_as_float(sign);
  mccl_u32 exponent = 113u;  // m * 2^-24 = (m << k) * 2^(-24-k): shift until the implicit bit (0x400) is set
  while ((m & 0x400u) == 0u) {
    m <<= 1;
    exponent -= 1u;
  }
  return mccl_as_float(sign | (exponent << 23) | ((m & 0x3FFu) << 13));
}

// float32 -> float16, round to nearest even; overflow becomes Inf, NaN the quiet NaN 0x7E00 (with sign).
inline mccl_u16 mccl_f32_to_f16(float f) {
  mccl_u32 x = mccl_as_bits(f);
  mccl_u32 sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return mccl_u16(sign | 0x7E00u);
  if (x >= 0x47800000u) return mccl_u16(sign | 0x7C00u);  // >= 2^16: Inf
  if (x >= 0x38800000u) {  // >= 2^-14: a normal half; rebias the exponent, round off 13 bits
    mccl_u32 r = x - 0x38000000u;
    r += 0x0FFFu + ((r >> 13) & 1u);  // a carry moves into the exponent (65520 and up: Inf)
    return mccl_u16(sign | (r >> 13));
  }
  if (x < 0x33000000u) return mccl_u16(sign);  // below 2^-25 (half the smallest subnormal): zero
  mccl_u32 shift = 126u - (x >> 23);  // value = mantissa * 2^(e-150); units of 2^-24: mantissa >> shift
  mccl_u32 mantissa = (x & 0x7FFFFFu) | 0x800000u;
  mccl_u32 q = mantissa >> shift;
  mccl_u32 rest = mantissa & ((1u << shift) - 1u);
  mccl_u32 half = 1u << (shift - 1u);
  q += mccl_u32((rest > half) || ((rest == half) && ((q & 1u) != 0u)));
  return mccl_u16(sign | q);  // q == 0x400 is the smallest normal: the encoding carries over
}

// bfloat16 is the top half of a float32.
inline float mccl_bf16_to_f32(mccl_u16 h) { return mccl_as_float(mccl_u32(h) << 16); }

// float32 -> bfloat16, round to nearest even; NaN keeps its top bits with the quiet bit set.
inline mccl_u16 mccl_f32_to_bf16(float f) {
  mccl_u32 u = mccl_as_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return mccl_u16((u >> 16) | 0x40u);
  return mccl_u16((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// One element of dst = dst OP src, per storage type (what each kernel does per thread).
inline float mccl_reduce_f32(int op, float a, float b) { return mccl_apply(op, a, b); }
inline mccl_u16 mccl_reduce_f16(int op, mccl_u16 a, mccl_u16 b) {
  return mccl_f32_to_f16(mccl_apply(op, mccl_f16_to_f32(a), mccl_f16_to_f32(b)));
}
inline mccl_u16 mccl_reduce_bf16(int op, mccl_u16 a, mccl_u16 b) {
  return mccl_f32_to_bf16(mccl_apply(op, mccl_bf16_to_f32(a), mccl_bf16_to_f32(b)));
}

#endif  // MCCL_REDUCE_ARITH_H
