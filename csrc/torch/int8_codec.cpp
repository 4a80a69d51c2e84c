#include "int8_codec.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include <c10/core/StreamGuard.h>

#include "int8_blocks.h"
#include "stream_order.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "a code is the low byte of a float32's bits");

namespace lightning_mccl {
namespace {

constexpr int64_t kBlock = mccl::kInt8Block;
constexpr int64_t kRow = 4 + kBlock;          // a block's bytes: its float32 scale, then its codes
constexpr double kMinScaled = 0x1.0p-100;     // blocks whose largest magnitude is below this travel as zeros
constexpr double kToNearest = 12582912.0;     // 1.5 * 2^23: v + it is a float32 whose low bits are round(v)
constexpr int32_t kScaleStep = 0x80;          // one unit in the last of a scale's 17 significant bits
constexpr int32_t kMaxScaleBits = 0x7C020800;  // 0x1.041p+121, the largest 17-bit float s whose 126 s is finite
constexpr int64_t kSignificands = 1 << 16;    // a scale's 16 significand bits after the leading one
constexpr int32_t kExponentBits = 0x7F800000;  // a float32's exponent field
constexpr int32_t kOneBits = 0x3F800000;       // 1.0f

// What the codec looks up, per device: for every 17-bit significand m in [1, 2), fl(1 / m)'s float32 bits plus
// 127 << 23, so that a scale's inverse is this minus the scale's exponent field (a scale's inverse without a
// division, which a device need not round correctly; the CPU does); and the value of each code, indexed by the
// uint8 that holds it (codes 127, -128, -127: +Inf, NaN, -Inf).
struct Tables {
  at::Tensor inverse;
  at::Tensor code_values;
};

Tables make_tables(const c10::Device& device) {
  std::vector<int32_t> inverse(kSignificands);
  for (int64_t i = 0; i < kSignificands; ++i) {
    const float r = 1.0f / (1.0f + static_cast<float>(i) / kSignificands);  // 1 / m, m exact
    std::memcpy(&inverse[i], &r, sizeof r);
    inverse[i] += 127 << 23;
  }
  std::vector<float> values(256);
  for (int u = 0; u < 256; ++u) values[u] = static_cast<float>(static_cast<int8_t>(u));
  values[127] = std::numeric_limits<float>::infinity();
  values[128] = std::numeric_limits<float>::quiet_NaN();
  values[129] = -std::numeric_limits<float>::infinity();
  // Copied once, and done when .to() returns (so any stream may read them), on the side stream: the host waits
  // for that stream, never for the caller's kernels.
  c10::OptionalStreamGuard guard(device.is_cpu() ? std::nullopt : std::optional<c10::Stream>(side_stream(device)));
  const auto cpu = at::TensorOptions().device(at::kCPU);
  return {at::tensor(inverse, cpu.dtype(at::kInt)).to(device), at::tensor(values, cpu.dtype(at::kFloat)).to(device)};
}

// Never destroyed: device memory must not be freed after the device's runtime is gone at exit.
const Tables& tables(const c10::Device& device) {
  static auto* mu = new std::mutex();
  static auto* cache = new std::unordered_map<c10::Device, Tables>();
  std::lock_guard<std::mutex> lock(*mu);
  auto it = cache->find(device);
  if (it == cache->end()) it = cache->emplace(device, make_tables(device)).first;
  return it->second;
}

struct Scales {
  at::Tensor scale;    // float32 [blocks]: 0 for blocks that travel as zeros
  at::Tensor inverse;  // fl(1 / scale); 1 where the scale is 0 (every finite value there is below 2^-100)
};

// int8_blocks.cc's scale_of, block by block: the least 17-bit float s with 126 s >= M (at most kMaxScaleBits).
// M times a float just above 1/126, rounded up to 17 bits, is at least M / 126 and within one step of s, and
// 126 s is exact, so one comparison decides it exactly. Positive floats order as their bits.
Scales scales_of(const at::Tensor& largest, const Tables& t) {
  static const double above = std::nextafter(1.0f / 126.0f, 1.0f);  // fl(1/126) (1 + 2^-24) > 1/126 (1 + 2^-24)
  const at::Tensor candidate = at::bitwise_and(at::mul(largest, above).view(at::kInt) + (kScaleStep - 1),
                                               ~(kScaleStep - 1));
  const at::Tensor below = candidate - kScaleStep;
  const at::Tensor scaled = largest >= kMinScaled;
  // Blocks that travel as zeros take the scale 1 here: an inverse of 1 leaves their finite codes 0.
  const at::Tensor bits = at::where(
      scaled, at::clamp_max(at::where(at::mul(below.view(at::kFloat), 126) >= largest, below, candidate), kMaxScaleBits),
      kOneBits);
  // s = m 2^(E - 127), E its biased exponent: 1 / s = (1 / m) 2^(127 - E), the exponent field moved exactly.
  const at::Tensor significand = at::bitwise_and(at::bitwise_right_shift(bits, 7), kSignificands - 1);
  const at::Tensor inverse = at::index_select(t.inverse, 0, significand) - at::bitwise_and(bits, kExponentBits);
  return {at::where(scaled, bits.view(at::kFloat), 0.0), inverse.view(at::kFloat)};
}

}  // namespace

at::Tensor int8_wire_view(const at::Tensor& blocks, int64_t count) {
  return blocks.view(-1).narrow(0, 0, static_cast<int64_t>(mccl::int8_wire_bytes(static_cast<size_t>(count))));
}

at::Tensor int8_encode_blocks(const at::Tensor& values, const at::Tensor& residual) {
  const int64_t count = values.numel(), blocks = (count + kBlock - 1) / kBlock, padded = blocks * kBlock;
  const Tables& t = tables(values.device());
  at::Tensor x = values.view(-1);
  if (residual.defined() || padded != count) {  // the values to encode, in whole blocks (zeros after the last)
    at::Tensor sum = at::empty({padded}, values.options());
    at::Tensor head = sum.narrow(0, 0, count);
    if (residual.defined()) at::add_out(head, x, residual.view(-1));
    else head.copy_(x);
    sum.narrow(0, count, padded - count).zero_();
    x = sum;
  }
  const at::Tensor y = x.view({blocks, kBlock});
  at::Tensor work = at::nan_to_num(y, 0.0, 0.0, 0.0);  // the largest finite magnitude: NaN and Inf count as 0
  const auto [least, most] = at::aminmax(work, 1);
  const Scales s = scales_of(at::maximum(-least, most), t);
  at::mul_out(work, y, s.inverse.unsqueeze(1));
  at::nan_to_num_(work, -128.0, 127.0, -127.0);  // NaN, +Inf, -Inf: their codes (finite products are within 126.5)
  work.add_(kToNearest);  // rounded to the nearest integer, ties to even: its low byte is the code
  at::Tensor out = at::empty({blocks, kRow}, values.options().dtype(at::kByte));
  out.narrow(1, 0, 4).copy_(s.scale.view(at::kByte).view({blocks, 4}));
  out.narrow(1, 4, kBlock).copy_(work.view(at::kByte).view({blocks, kBlock, 4}).select(2, 0));
  if (residual.defined()) {
    work.sub_(kToNearest);  // the codes, as floats; code * scale is exact, so y - code * scale rounds once
    at::Tensor kept = residual;  // a handle: the residual's memory is written
    if (padded == count) {
      at::Tensor rows = kept.view({blocks, kBlock});
      at::addcmul_out(rows, y, work, s.scale.unsqueeze(1), -1);
    } else {
      kept.view(-1).copy_(at::addcmul(y, work, s.scale.unsqueeze(1), -1).view(-1).narrow(0, 0, count));
    }
    at::nan_to_num_(kept, 0.0, 0.0, 0.0);  // a NaN or Inf must not come back in the next call
  }
  return out;
}

void int8_decode_blocks(const at::Tensor& blocks, const at::Tensor& out) {
  const int64_t count = out.numel(), rows = blocks.size(0);
  const Tables& t = tables(blocks.device());
  const at::Tensor scale = blocks.narrow(1, 0, 4).contiguous().view(at::kFloat);  // [rows, 1]
  const at::Tensor factor = at::where(scale > 0, scale, 1.0);  // a zero block's codes are 0, or a NaN or Inf
  const at::Tensor codes = blocks.narrow(1, 4, kBlock).to(at::kInt).view(-1);
  const at::Tensor values = at::index_select(t.code_values, 0, codes).view({rows, kBlock});
  const bool whole = rows * kBlock == count;
  at::Tensor target = whole ? out.view({rows, kBlock}) : at::empty({rows, kBlock}, out.options());
  at::mul_out(target, values, factor);
  // One NaN for every device (the engine's 0x7FC00000): a device's product may carry another.
  const double inf = std::numeric_limits<double>::infinity();
  at::nan_to_num_(target, std::numeric_limits<double>::quiet_NaN(), inf, -inf);
  if (!whole) out.view(-1).copy_(target.view(-1).narrow(0, 0, count));
}

}  // namespace lightning_mccl
