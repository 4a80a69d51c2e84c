#include "int8_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "float_bits.h"
#include "reduce.h"
#include "reduce_pool.h"
#include "vector_clones.h"

namespace mccl {
namespace {

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr int32_t kInfBits = 0x7F800000;
constexpr float kMinScaled = 0x1.0p-100f;  // blocks whose largest magnitude is below this travel as zeros
constexpr uint32_t kScaleStep = 0x80u;     // one unit in the last of a scale's 17 significant bits
constexpr float kMaxScale = 0x1.041p+121f;  // the largest 17-bit float s whose 126 s is finite
constexpr size_t kScaleBytes = sizeof(float);

// The largest finite magnitude of a block, as bits: non-negative floats order as their bits do, and an
// integer maximum vectorises where a float one (NaN-aware) does not.
MCCL_TARGET_CLONES int32_t max_finite_bits(const float* __restrict x, size_t n) {
  int32_t best = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t a = static_cast<int32_t>(f32_bits(x[i]) & kAbsMask);
    const int32_t finite = a < kInfBits ? a : 0;
    best = finite > best ? finite : best;
  }
  return best;
}

// s: the smallest float with 17 significant bits that is at least largest / 126 (int8_blocks.h says why). The
// quotient rounded up to 17 bits is within one step of it, and 126 * s is exact (6 + 17 bits), so the
// comparisons decide it exactly, whatever rounding the candidate came from. Past kMaxScale, the largest
// magnitudes still round to code 126 (|x| / s < 126 (1 + 2^-16)), and 126 s stays finite.
float scale_of(float largest) {
  if (!(largest >= kMinScaled)) return 0.0f;
  const uint32_t candidate = (f32_bits(largest / 126.0f) + kScaleStep - 1) & ~(kScaleStep - 1);
  float s = bits_f32(candidate + kScaleStep);
  if (bits_f32(candidate - kScaleStep) * 126.0f >= largest) s = bits_f32(candidate - kScaleStep);
  else if (bits_f32(candidate) * 126.0f >= largest) s = bits_f32(candidate);
  return std::min(s, kMaxScale);
}

// Selects on bits only (float_bits.h), so that the loops vectorise. Every finite |x| * inverse is at most
// 126 (1 + 2^-24), since s >= M / 126; the clamp only guards the conversion.
MCCL_TARGET_CLONES void encode_codes(int8_t* __restrict codes, const float* __restrict x, size_t n, float inverse) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = f32_bits(x[i]);
    const int32_t a = static_cast<int32_t>(bits & kAbsMask);
    const float finite = bits_f32(select_bits(a < kInfBits, bits, 0u));
    int32_t code = static_cast<int32_t>(std::nearbyint(finite * inverse));
    code = code < -126 ? -126 : code;
    code = code > 126 ? 126 : code;
    const uint32_t infinity = bits >> 31 ? uint32_t(-127) : 127u;
    const uint32_t special = select_bits(a > kInfBits, uint32_t(-128), infinity);
    codes[i] = static_cast<int8_t>(select_bits(a < kInfBits, static_cast<uint32_t>(code), special));
  }
}

MCCL_TARGET_CLONES void decode_codes(float* __restrict x, const int8_t* __restrict codes, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) {
    const int32_t code = codes[i];
    uint32_t v = f32_bits(static_cast<float>(code) * scale);
    v = select_bits(code == 127, kInfBits, v);
    v = select_bits(code == -127, kInfBits | 0x80000000u, v);
    v = select_bits(code == -128, 0x7FC00000u, v);  // quiet NaN
    x[i] = bits_f32(v);
  }
}

void encode_run(char* wire, const float* src, size_t count) {
  for (size_t b = 0; b < count; b += kInt8Block) {
    const size_t n = std::min(kInt8Block, count - b);
    const float scale = scale_of(bits_f32(static_cast<uint32_t>(max_finite_bits(src + b, n))));
    std::memcpy(wire, &scale, kScaleBytes);
    encode_codes(reinterpret_cast<int8_t*>(wire + kScaleBytes), src + b, n, scale > 0.0f ? 1.0f / scale : 0.0f);
    wire += kScaleBytes + n;
  }
}

void decode_run(float* dst, const char* wire, size_t count) {
  for (size_t b = 0; b < count; b += kInt8Block) {
    const size_t n = std::min(kInt8Block, count - b);
    float scale;
    std::memcpy(&scale, wire, kScaleBytes);
    decode_codes(dst + b, reinterpret_cast<const int8_t*>(wire + kScaleBytes), n, scale);
    wire += kScaleBytes + n;
  }
}

}  // namespace

ValueRange int8_segment(size_t count, int part, int parts) {
  const size_t blocks = (count + kInt8Block - 1) / kInt8Block, k = static_cast<size_t>(part);
  const size_t base = blocks / parts, extra = blocks % parts;
  const size_t first = (k * base + std::min(k, extra)) * kInt8Block;
  const size_t last = std::min(count, first + (base + (k < extra)) * kInt8Block);
  return {std::min(first, count), last > first ? last - first : 0};
}

void int8_encode(char* wire, const float* src, size_t count, size_t max_parts) {
  run_parts(count, kSplitConversionsFrom, kInt8Block, max_parts, [&](size_t begin, size_t n) {
    encode_run(wire + int8_wire_bytes(begin), src + begin, n);
  });
}

void int8_decode(float* dst, const char* wire, size_t count, size_t max_parts) {
  run_parts(count, kSplitConversionsFrom, kInt8Block, max_parts, [&](size_t begin, size_t n) {
    decode_run(dst + begin, wire + int8_wire_bytes(begin), n);
  });
}

void int8_round(float* data, size_t count, size_t max_parts) {
  run_parts(count, kSplitConversionsFrom, kInt8Block, max_parts, [&](size_t begin, size_t n) {
    char block[kScaleBytes + kInt8Block];
    for (size_t b = begin; b < begin + n; b += kInt8Block) {
      const size_t m = std::min(kInt8Block, begin + n - b);
      encode_run(block, data + b, m);
      decode_run(data + b, block, m);
    }
  });
}

}  // namespace mccl
