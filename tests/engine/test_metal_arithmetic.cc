// The Metal kernels' arithmetic (src/lightning_mccl/metal/arithmetic.h), built as C++, against the engine's codec
// (int8_blocks.h, codec.h), bit for bit: the inverse of every 17-bit scale significand; the scale of blocks
// whose largest magnitude sweeps the floats (and sits at 126 times a 17-bit float or a float either side); the
// bytes, decoded values and error-feedback residuals of blocks of every kind (random magnitudes over 2^-140..
// 2^120, zeros, denormals, NaN, Inf, the largest floats: the cases of tests/torch/test_int8_codec.py, which checks
// the same arithmetic against the device codec); decode-and-add; and DiLoCo's outer step against its formula.
// Runs in `make test` (plain and ASan+UBSan), under qemu for arm64 (`make test-arm64`), and is linked for macOS
// (`make check-macos`). What Metal itself computes is checked on a Mac only (tests/torch/test_metal_kernels.py).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "arithmetic.h"
#include "check.h"
#include "codec.h"
#include "int8_cases.h"
#include "int8_blocks.h"

using namespace mccl;
using namespace mccl_arith;
using mccl_test::Random;
using mccl_test::values_of_every_kind;

namespace {

uint32_t bits(float x) { return f32_bits(x); }

std::vector<char> engine_encoded(const std::vector<float>& x, float* residual = nullptr) {
  std::vector<char> wire(int8_wire_bytes(x.size()));
  if (residual == nullptr) {
    int8_encode(wire.data(), x.data(), x.size(), 1);
  } else {
    Codec::make(WireType::kInt8Blocks, DataType::kFloat32, ReduceOp::kSum, 1, 1)
        ->encode(wire.data(), x.data(), x.size(), residual);
  }
  return wire;
}

// The header's blocks (kRow bytes each), trimmed to the wire form.
std::vector<char> header_encoded(const std::vector<float>& x, float* residual = nullptr) {
  std::vector<unsigned char> blocks((x.size() + kInt8Block - 1) / kInt8Block * kRow);
  encode_on_cpu(x.data(), residual, blocks.data(), x.size());
  return std::vector<char>(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(int8_wire_bytes(x.size())));
}

// The kernels' layout of a wire form: each block kRow bytes.
std::vector<unsigned char> as_blocks(const std::vector<char>& wire, size_t count) {
  std::vector<unsigned char> blocks((count + kInt8Block - 1) / kInt8Block * kRow);
  std::memcpy(blocks.data(), wire.data(), wire.size());
  return blocks;
}

size_t first_difference(const std::vector<char>& a, const std::vector<char>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return i;
  return a.size();
}

const size_t kSizes[] = {1, 255, 256, 257, 5000, 70001};

}  // namespace

TEST(the_inverse_of_every_scale_is_the_correctly_rounded_one) {
  CHECK(bits(int8_inverse(0.0f)) == 0u);
  int wrong = 0;
  for (int exponent : {-107, -64, -1, 0, 1, 64, 120}) {
    for (uint32_t k = 0; k < 65536; ++k) {
      const float scale = std::ldexp(1.0f + static_cast<float>(k) / 65536.0f, exponent);
      if (bits(int8_inverse(scale)) != bits(1.0f / scale) && wrong++ < 5)
        std::fprintf(stderr, "  scale %a: inverse %a, 1/scale %a\n", scale, int8_inverse(scale), 1.0f / scale);
    }
  }
  const float largest = bits_f32(kMaxScaleBits);
  CHECK(bits(int8_inverse(largest)) == bits(1.0f / largest));
  CHECK_MSG(wrong == 0, "%d inverses differ", wrong);
}

// Blocks led by a magnitude M from a sweep of the floats (below 2^-100, denormals and the largest included),
// each followed by smaller values: the scale is the first four bytes of each block.
TEST(the_scale_of_every_largest_magnitude_is_the_engines) {
  const size_t blocks = mccl_test::sized(1 << 16, 1 << 12);
  Random random{7};
  std::vector<float> x(blocks * kInt8Block);
  for (size_t b = 0; b < blocks; ++b) {
    const uint32_t m = b < 4 ? uint32_t(0x7F7FFFFFu - b) : static_cast<uint32_t>(random.next() % 0x7F800000u);
    for (size_t i = 0; i < kInt8Block; ++i)
      x[b * kInt8Block + i] = bits_f32(m) * static_cast<float>(static_cast<double>(random.next() >> 11) * 0x1.0p-53);
    x[b * kInt8Block + random.next() % kInt8Block] = (random.next() & 1) ? bits_f32(m) : -bits_f32(m);
  }
  const std::vector<char> engine = engine_encoded(x), header = header_encoded(x);
  const size_t at = first_difference(engine, header);
  CHECK_MSG(at == engine.size(), "the encodings differ at byte %zu (block %zu)", at, at / (kInt8Block + 4));
}

TEST(blocks_of_every_kind_encode_and_decode_as_the_engine) {
  for (size_t count : kSizes) {
    const std::vector<float> x = values_of_every_kind(count, count);
    const std::vector<char> engine = engine_encoded(x), header = header_encoded(x);
    const size_t at = first_difference(engine, header);
    CHECK_MSG(at == engine.size(), "%zu values: the encodings differ at byte %zu", count, at);
    std::vector<float> by_engine(count), by_header(count, 1.0f);
    int8_decode(by_engine.data(), engine.data(), count, 1);
    decode_on_cpu(as_blocks(engine, count).data(), by_header.data(), count, false);
    size_t differ = 0;
    for (size_t i = 0; i < count; ++i) differ += bits(by_engine[i]) != bits(by_header[i]);
    CHECK_MSG(differ == 0, "%zu values: %zu decoded values differ", count, differ);
  }
}

// Blocks of zeros, of denormals only (below 2^-100: they travel as zeros and stay whole in the residual), and
// of the largest floats of both signs.
TEST(blocks_of_zeros_denormals_and_extremes_are_the_engines) {
  const float denormal = std::numeric_limits<float>::denorm_min(), big = std::numeric_limits<float>::max();
  std::vector<float> x(3 * kInt8Block + 10);
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t block = i / kInt8Block;
    x[i] = block == 0 ? (i % 2 ? -0.0f : 0.0f) : block == 1 ? denormal * static_cast<float>(i % 97) * (i % 3 ? 1 : -1)
                                                             : (i % 2 ? big : -big) / static_cast<float>(1 + i % 5);
  }
  std::vector<float> engine_residual(x.size(), 0.0f), header_residual(x.size(), 0.0f);
  CHECK(engine_encoded(x, engine_residual.data()) == header_encoded(x, header_residual.data()));
  CHECK(std::memcmp(engine_residual.data(), header_residual.data(), x.size() * sizeof(float)) == 0);
  CHECK(bits(header_residual[kInt8Block + 5]) == bits(x[kInt8Block + 5]));  // a denormal kept whole
}

TEST(error_feedback_leaves_the_engines_residual) {
  for (size_t count : {size_t(257), size_t(65536), size_t(70001)}) {
    const std::vector<float> x = values_of_every_kind(count, 7 + count);
    std::vector<float> engine_residual = values_of_every_kind(count, 8 + count);
    for (float& r : engine_residual) r *= 1e-3f;
    std::vector<float> header_residual = engine_residual;
    const std::vector<char> engine = engine_encoded(x, engine_residual.data());
    const std::vector<char> header = header_encoded(x, header_residual.data());
    const size_t at = first_difference(engine, header);
    CHECK_MSG(at == engine.size(), "%zu values: the encodings differ at byte %zu", count, at);
    size_t differ = 0;
    for (size_t i = 0; i < count; ++i) differ += bits(engine_residual[i]) != bits(header_residual[i]);
    CHECK_MSG(differ == 0, "%zu values: %zu residuals differ", count, differ);
  }
}

// What the owner of a segment does with each contribution: decoded and added to its sum, NaN as one NaN.
TEST(decode_and_add_is_the_decoded_value_added) {
  const size_t count = 5000;
  const std::vector<float> x = values_of_every_kind(count, 11), base = values_of_every_kind(count, 12);
  const std::vector<char> wire = engine_encoded(x);
  std::vector<float> decoded(count), sum = base;
  int8_decode(decoded.data(), wire.data(), count, 1);
  decode_on_cpu(as_blocks(wire, count).data(), sum.data(), count, true);
  size_t differ = 0;
  for (size_t i = 0; i < count; ++i) {
    const float want = base[i] + decoded[i];
    differ += std::isnan(want) ? bits(sum[i]) != kNaNBits : bits(sum[i]) != bits(want);
  }
  CHECK_MSG(differ == 0, "%zu sums differ", differ);
}

TEST(diloco_pseudo_gradient_and_outer_step_follow_their_formulas) {
  Random random{3};
  size_t differ = 0;
  for (size_t i = 0; i < 100000; ++i) {
    const float anchor = static_cast<float>(random.normal()), weight = static_cast<float>(random.normal());
    const float mean = static_cast<float>(random.normal() * 1e-2), own = static_cast<float>(random.normal() * 1e-2);
    const float momentum = static_cast<float>(random.normal() * 1e-2);
    differ += bits(diloco_pseudo_gradient(anchor, weight)) != bits(anchor - weight);
    // The defaults (lr 1, mu 0): the anchor moves by the mean exactly, as plain float operations give it.
    float m = momentum, a = anchor, o = own;
    diloco_outer_step(mean, m, a, o, 1.0f, 0.0f);
    differ += bits(m) != bits(mean) || bits(a) != bits(anchor - mean) || bits(o) != bits(own - mean);
    // Nesterov: each fused step rounded once (a double's fma of float inputs, rounded to float).
    const float lr = 0.7f, mu = 0.9f;
    m = momentum, a = anchor, o = own;
    diloco_outer_step(mean, m, a, o, lr, mu);
    const float want_m = static_cast<float>(std::fma(double(mu), double(momentum), double(mean)));
    const float u = static_cast<float>(std::fma(double(mu), double(want_m), double(mean))) * lr;
    differ += bits(m) != bits(want_m) || bits(a) != bits(anchor - u) || bits(o) != bits(own - u);
  }
  CHECK_MSG(differ == 0, "%zu values differ", differ);
}

MCCL_TEST_MAIN
