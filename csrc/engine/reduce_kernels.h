// The element loops of the reduction kernels and what they are built from: half-precision conversions,
// codecs (how an element is stored, in which type the op computes) and ops. Plain counted loops over
// __restrict pointers with the codec and the op as template parameters, so g++ -O3 and clang
// auto-vectorise them; MCCL_TARGET_CLONES gives each an AVX2 and a baseline clone on x86-64 Linux.
// Included by reduce.cc only (its dispatch instantiates them), so everything here is internal to it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "float_bits.h"
#include "vector_clones.h"

namespace mccl {
namespace {

// ---------------------------------------------------------------------------------------------------
// Half-precision conversions. All branch-free (selects only) so the loops that use them vectorise.

// bfloat16 -> float32 is exact: a bfloat16 is the top half of a float32.
inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// float32 -> bfloat16, round to nearest even: add 0x7FFF plus the lowest kept bit, then truncate.
// A NaN could round into Inf (or wrap), so NaN keeps its top bits with the quiet bit set instead.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (u >> 16) | 0x40u;
  bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return uint16_t(is_nan ? quiet_nan : rounded);
}

// arm64 converts float16 in hardware (the Half codec below); elsewhere these two functions do.
#if defined(__aarch64__) && defined(__ARM_FP16_FORMAT_IEEE)
#define MCCL_NATIVE_FP16 1
#else
#define MCCL_NATIVE_FP16 0

// float16 -> float32 (exact). Normal, Inf and NaN: move exponent+mantissa into float32 position with the
// exponent offset by 224, so half exponent 31 lands on 255 (Inf/NaN), then rebias by multiplying with
// 2^-112. Subnormal: put the mantissa m in the low bits of 0.5f (giving 0.5 + m*2^-24) and subtract 0.5.
inline float fp16_to_f32(uint16_t h) {
  uint32_t w = uint32_t(h) << 16;
  uint32_t sign = w & 0x80000000u;
  uint32_t two_w = w + w;  // sign shifted out; exponent in the top 5 bits
  float normal = bits_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  float subnormal = bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
  uint32_t magnitude = select_bits(two_w < (1u << 27), f32_bits(subnormal), f32_bits(normal));
  return bits_f32(sign | magnitude);
}

// float32 -> float16, round to nearest even. Scaling |f| by 2^112 then 2^-110 turns everything that
// overflows half into Inf. Adding a power of two ("bias") derived from f's exponent makes the FPU
// itself round the mantissa to exactly the bits half keeps (10, fewer for subnormals), ties to even;
// the half exponent and mantissa are then read out of the sum. NaN becomes the quiet NaN 0x7E00.
inline uint16_t f32_to_fp16(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t w = f32_bits(f);
  uint32_t shl1_w = w + w;
  uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;  // below half's normal range: fixed subnormal quantum
  base = bits_f32((bias >> 1) + 0x07800000u) + base;
  uint32_t bits = f32_bits(base);
  uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  uint32_t mantissa_bits = bits & 0x00000FFFu;
  uint32_t nonsign = exp_bits + mantissa_bits;  // a mantissa carry bumps the exponent, up to Inf
  return uint16_t((sign >> 16) | select_bits(shl1_w > 0xFF000000u, 0x7E00u, nonsign));
}
#endif

// ---------------------------------------------------------------------------------------------------
// Codecs: how an element is stored and in which type the op computes.

template <typename T>
struct Native {
  using Storage = T;
  using Compute = T;
  static T load(T x) { return x; }
  static T store(T x) { return x; }
};
#if MCCL_NATIVE_FP16
// arm64: the hardware converts (FCVT; in the loops FCVTL/FCVTN on 4 lanes), rounding to nearest even with
// subnormals kept, so the results equal the code above except for which quiet NaN a NaN becomes.
struct Half {
  using Storage = uint16_t;
  using Compute = float;
  static float load(uint16_t x) {
    __fp16 h;
    std::memcpy(&h, &x, sizeof h);
    return float(h);
  }
  static uint16_t store(float x) {
    __fp16 h = __fp16(x);
    uint16_t u;
    std::memcpy(&u, &h, sizeof u);
    return u;
  }
};
#else
struct Half {
  using Storage = uint16_t;
  using Compute = float;
  static float load(uint16_t x) { return fp16_to_f32(x); }
  static uint16_t store(float x) { return f32_to_fp16(x); }
};
#endif
struct BFloat {
  using Storage = uint16_t;
  using Compute = float;
  static float load(uint16_t x) { return bf16_to_f32(x); }
  static uint16_t store(float x) { return f32_to_bf16(x); }
};
struct Bool {  // bytes; any nonzero input counts as true, outputs are exactly 0 or 1
  using Storage = uint8_t;
  using Compute = bool;
  static bool load(uint8_t x) { return x != 0; }
  static uint8_t store(bool x) { return uint8_t(x); }
};

// ---------------------------------------------------------------------------------------------------
// Ops. Integer SUM/PRODUCT run in the unsigned type so overflow wraps instead of being UB. Float MIN/MAX
// return a NaN operand if there is one (a bitwise | keeps the select branch-free).

template <typename T>
using Unsigned =
    typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::common_type<T>>::type;

template <typename T>
struct Sum {
  static T apply(T a, T b) { return T(Unsigned<T>(a) + Unsigned<T>(b)); }
};
template <typename T>
struct Product {
  static T apply(T a, T b) { return T(Unsigned<T>(a) * Unsigned<T>(b)); }
};
template <typename T>
struct Min {
  static T apply(T a, T b) { return ((a < b) | (a != a)) ? a : b; }
};
template <typename T>
struct Max {
  static T apply(T a, T b) { return ((a > b) | (a != a)) ? a : b; }
};
template <typename T>
struct BitAnd {
  static T apply(T a, T b) { return T(a & b); }
};
template <typename T>
struct BitOr {
  static T apply(T a, T b) { return T(a | b); }
};
template <typename T>
struct BitXor {
  static T apply(T a, T b) { return T(a ^ b); }
};

// ---------------------------------------------------------------------------------------------------
// Kernels (the only loops over elements).

// dst[i] = dst[i] OP src[i].
template <class C, class Op>
MCCL_TARGET_CLONES void kernel_into(typename C::Storage* __restrict dst,
                                    const typename C::Storage* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = C::store(Op::apply(C::load(dst[i]), C::load(src[i])));
}

// buf[i] /= divisor: floating types divide in their compute type, integers truncate toward zero.
template <class C>
MCCL_TARGET_CLONES void kernel_divide(typename C::Storage* __restrict buf, size_t n, int64_t divisor) {
  using T = typename C::Compute;
  if constexpr (std::is_floating_point_v<T>) {
    const T d = T(divisor);
    for (size_t i = 0; i < n; ++i) buf[i] = C::store(C::load(buf[i]) / d);
  } else {
    for (size_t i = 0; i < n; ++i) buf[i] = T(int64_t(buf[i]) / divisor);
  }
}

// Wire compression: float32 to and from a half type (C = Half or BFloat), rounding to nearest even.
template <class C>
MCCL_TARGET_CLONES void kernel_narrow(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = C::store(src[i]);
}
template <class C>
MCCL_TARGET_CLONES void kernel_widen(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = C::load(src[i]);
}
template <class C>
MCCL_TARGET_CLONES void kernel_round_through(float* __restrict buf, size_t n) {
  for (size_t i = 0; i < n; ++i) buf[i] = C::load(C::store(buf[i]));
}

}  // namespace
}  // namespace mccl
