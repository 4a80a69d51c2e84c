// The 8-bit wire format (int8_blocks.h) on its own: the scale exactly the smallest 17-bit float at least M / 126
// (what the device encoder computes too), every finite value within s/2 of what it decodes to, a decoded block
// that encodes to the same bytes, NaN and Inf that no scale hides, blocks too small to scale, short last blocks,
// the split over the reduction pool equal to one thread, and the 8-bit allreduce's segments of whole blocks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "check.h"
#include "inputs.h"
#include "int8_blocks.h"
#include "reduce.h"
#include "reduce_pool.h"

using namespace mccl;
using mccl_test::input;

namespace {

// Values over many magnitudes: block b's values are input * 2^(b mod 40 - 20), and some blocks hold a
// single large value among small ones (the worst case for a shared scale).
std::vector<float> varied(size_t count) {
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i) {
    const size_t block = i / kInt8Block;
    x[i] = std::ldexp(input(3, i), static_cast<int>(block % 40) - 20);
    if (block % 7 == 3) x[i] *= i % kInt8Block == 5 ? 1000.0f : 0.001f;
  }
  return x;
}

std::vector<char> encoded(const std::vector<float>& x) {
  std::vector<char> wire(int8_wire_bytes(x.size()));
  int8_encode(wire.data(), x.data(), x.size(), 1);
  return wire;
}

std::vector<float> decoded(const std::vector<char>& wire, size_t count) {
  std::vector<float> x(count);
  int8_decode(x.data(), wire.data(), count, 1);
  return x;
}

// The largest finite magnitude of the block holding value i.
float block_max(const std::vector<float>& x, size_t i) {
  const size_t first = i / kInt8Block * kInt8Block, last = std::min(x.size(), first + kInt8Block);
  float m = 0;
  for (size_t k = first; k < last; ++k)
    if (std::isfinite(x[k])) m = std::max(m, std::fabs(x[k]));
  return m;
}

}  // namespace

TEST(wire_size_is_one_scale_per_block) {
  CHECK(int8_wire_bytes(0) == 0);
  CHECK(int8_wire_bytes(1) == 5);
  CHECK(int8_wire_bytes(kInt8Block) == kInt8Block + 4);
  CHECK(int8_wire_bytes(kInt8Block + 1) == kInt8Block + 1 + 8);
}

// The largest scale: 17 significant bits, 126 times it finite, 126 times the next one not.
constexpr float kMaxScale = 0x1.041p+121f;

// Where a rounded quotient and the exact one part: M = 126 g exactly for a 17-bit g (s = g), and M one float
// either side of it; the largest and smallest magnitudes that are scaled; and many values in between.
TEST(the_scale_is_the_smallest_17_bit_float_at_least_the_largest_over_126) {
  uint32_t max_bits;
  std::memcpy(&max_bits, &kMaxScale, sizeof max_bits);
  const uint32_t next_bits = max_bits + 0x80;
  float next;
  std::memcpy(&next, &next_bits, sizeof next);
  CHECK((max_bits & 0x7F) == 0 && std::isfinite(kMaxScale * 126.0f) && std::isinf(next * 126.0f));
  std::vector<float> largest = {0x1.0p-100f, std::numeric_limits<float>::max(), 1.0f, 126.0f, 3.0e-20f};
  for (uint32_t k = 0; k < 3000; ++k) {
    const uint32_t significand = 65536 + (k * 2654435761u) % 65536;  // 17 bits
    const float m = std::ldexp(static_cast<float>(significand), static_cast<int>(k % 200) - 110) * 126.0f;  // exact
    largest.insert(largest.end(), {m, std::nextafter(m, 0.0f), std::nextafter(m, 1e38f)});
    largest.push_back(std::ldexp(std::fabs(input(8, k)) + 0.5f, static_cast<int>(k % 220) - 99));
  }
  for (float m : largest) {
    if (m < 0x1.0p-100f) continue;  // zeros (zero_and_tiny_blocks_travel_as_zeros)
    std::vector<float> x(kInt8Block, 0.0f);
    x[17] = -m;
    float s;
    std::memcpy(&s, encoded(x).data(), sizeof s);
    const float back = decoded(encoded(x), x.size())[17];
    CHECK_MSG(std::fabs(double(back) + m) <= double(s) / 2, "M %a decodes to %a (scale %a)", m, back, s);
    uint32_t bits;
    std::memcpy(&bits, &s, sizeof bits);
    float below;
    const uint32_t below_bits = bits - 0x80;  // one step less in the 17th significant bit
    std::memcpy(&below, &below_bits, sizeof below);
    CHECK_MSG((bits & 0x7F) == 0, "M %a: scale %a has more than 17 significant bits", m, s);
    if (double(m) / 126 > double(kMaxScale)) {  // 126 s must stay finite
      CHECK_MSG(s == kMaxScale, "M %a: scale %a, expected the largest, %a", m, s, kMaxScale);
      continue;
    }
    CHECK_MSG(double(s) * 126 >= double(m) && double(below) * 126 < double(m), "M %a: scale %a is not the least "
              "17-bit float at least M / 126", m, s);
  }
}

TEST(every_value_is_within_half_a_step_of_its_code) {
  const size_t count = 40 * kInt8Block + 77;  // a short last block
  const std::vector<float> x = varied(count);
  const std::vector<char> wire = encoded(x);
  const std::vector<float> back = decoded(wire, count);
  for (size_t i = 0; i < count; ++i) {
    const float m = block_max(x, i);
    // s <= M / 126 (1 + 2^-16), error <= s / 2
    const double bound = m / 252.0 * (1 + std::ldexp(1.0, -16)) * (1 + 1e-6);
    CHECK_MSG(std::fabs(double(back[i]) - x[i]) <= bound, "i %zu: %g decodes to %g (block max %g)", i, x[i], back[i], m);
  }
  // The block's largest value comes back within one part in 2^16 (its code is +-126).
  for (size_t b = 0; b < count; b += kInt8Block) {
    size_t at = b;
    for (size_t k = b; k < std::min(count, b + kInt8Block); ++k)
      if (std::fabs(x[k]) > std::fabs(x[at])) at = k;
    CHECK_MSG(std::fabs(back[at] - x[at]) <= std::fabs(x[at]) * std::ldexp(1.0, -15), "block %zu", b / kInt8Block);
  }
}

TEST(a_decoded_block_encodes_to_the_same_bytes) {
  const size_t count = 40 * kInt8Block + 77;
  const std::vector<float> x = varied(count);
  const std::vector<char> once = encoded(x);
  const std::vector<float> back = decoded(once, count);
  CHECK(encoded(back) == once);
  std::vector<float> rounded = x;
  int8_round(rounded.data(), count, 1);
  CHECK(std::memcmp(rounded.data(), back.data(), count * sizeof(float)) == 0);
}

TEST(nan_and_inf_come_out_as_themselves_and_leave_the_block_scaled) {
  std::vector<float> x(2 * kInt8Block + 3);
  for (size_t i = 0; i < x.size(); ++i) x[i] = input(1, i);
  const float inf = std::numeric_limits<float>::infinity();
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[4] = inf;
  x[5] = -inf;
  x[kInt8Block + 9] = -std::numeric_limits<float>::signaling_NaN();
  x[2 * kInt8Block + 1] = inf;  // in the short last block
  const std::vector<float> back = decoded(encoded(x), x.size());
  CHECK(std::isnan(back[3]) && std::isnan(back[kInt8Block + 9]));
  CHECK(back[4] == inf && back[5] == -inf && back[2 * kInt8Block + 1] == inf);
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) continue;
    CHECK_MSG(std::fabs(back[i] - x[i]) <= block_max(x, i) / 252.0 * 1.0001, "i %zu: %g decodes to %g", i, x[i], back[i]);
  }
}

TEST(zero_and_tiny_blocks_travel_as_zeros) {
  std::vector<float> x(3 * kInt8Block, 0.0f);
  for (size_t i = kInt8Block; i < 2 * kInt8Block; ++i) x[i] = input(2, i) * 1e-32f;  // below 2^-100
  x[2 * kInt8Block] = 1e-29f;                                                       // above it: scaled
  const std::vector<float> back = decoded(encoded(x), x.size());
  for (size_t i = 0; i < 2 * kInt8Block; ++i) CHECK_MSG(back[i] == 0.0f, "i %zu: %g", i, back[i]);
  CHECK(std::fabs(back[2 * kInt8Block] - 1e-29f) <= 1e-29f * std::ldexp(1.0, -15));
}

// Element-wise the same work, so the same bytes as one thread, on a count that ends mid-block and mid-part.
TEST(conversions_split_over_threads_equal_one_thread) {
  const size_t count = 3 * kSplitConversionsFrom + 4099;
  const std::vector<float> x = varied(count);
  std::vector<char> one(int8_wire_bytes(count)), split(int8_wire_bytes(count));
  int8_encode(one.data(), x.data(), count, 1);
  int8_encode(split.data(), x.data(), count, 0);
  CHECK_MSG(one == split, "encode differs when split over %zu threads", pool_width());
  std::vector<float> back_one(count), back_split(count);
  int8_decode(back_one.data(), one.data(), count, 1);
  int8_decode(back_split.data(), one.data(), count, 0);
  CHECK(std::memcmp(back_one.data(), back_split.data(), count * sizeof(float)) == 0);
  std::vector<float> rounded = x;
  int8_round(rounded.data(), count, 0);
  CHECK(std::memcmp(rounded.data(), back_one.data(), count * sizeof(float)) == 0);
}

// The 8-bit allreduce's segments: whole blocks, in order, covering the values, as even as whole blocks allow.
TEST(segments_are_whole_blocks_in_order) {
  for (size_t count : {size_t(0), size_t(1), size_t(255), size_t(257), size_t(3000), size_t(40007)}) {
    for (int parts : {1, 2, 3, 8, 24}) {
      size_t next = 0, most = 0, least = SIZE_MAX;
      for (int k = 0; k < parts; ++k) {
        const ValueRange r = int8_segment(count, k, parts);
        CHECK_MSG(r.first == next && (r.first % kInt8Block == 0 || r.first == count), "count %zu parts %d: segment %d starts at %zu",
                  count, parts, k, r.first);
        CHECK_MSG(r.count % kInt8Block == 0 || r.first + r.count == count, "count %zu parts %d: segment %d",
                  count, parts, k);
        next = r.first + r.count;
        const size_t blocks = (r.count + kInt8Block - 1) / kInt8Block;
        most = std::max(most, blocks), least = std::min(least, blocks);
      }
      CHECK_MSG(next == count && most - least <= 1, "count %zu parts %d: ends at %zu, blocks %zu..%zu", count, parts,
                next, least, most);
    }
  }
}

MCCL_TEST_MAIN
