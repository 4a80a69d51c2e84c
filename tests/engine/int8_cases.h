// The 8-bit format's test values, shared by the C++ tests of the Metal kernels' arithmetic and of their text
// (test_metal_arithmetic.cc, test_metal_kernels.cc): the cases of tests/torch/test_int8_codec.py's _values.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "int8_blocks.h"

namespace mccl_test {

// splitmix64: a deterministic stream of 64-bit words.
struct Random {
  uint64_t state;
  uint64_t next() {
    uint64_t z = state += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double normal() {  // roughly gaussian: the sum of four uniforms, centred
    double s = 0;
    for (int k = 0; k < 4; ++k) s += static_cast<double>(next() >> 11) * 0x1.0p-53;
    return (s - 2.0) * 1.7;
  }
};

// tests/torch/test_int8_codec.py's _values, in C++: block magnitudes over 2^-140..2^120; one block in three led
// by 126 g for a 17-bit g or a float either side of it; and the special values at 1 + 37 k.
inline std::vector<float> values_of_every_kind(size_t count, uint64_t seed) {
  Random random{seed};
  std::vector<float> x(count);
  int exponent = 0;
  for (size_t i = 0; i < count; ++i) {
    if (i % mccl::kInt8Block == 0) exponent = static_cast<int>(random.next() % 260) - 140;
    x[i] = static_cast<float>(std::ldexp(random.normal(), exponent));
  }
  for (size_t first = 0; first < count; first += 3 * mccl::kInt8Block) {
    const float g = std::ldexp(static_cast<float>(65536 + random.next() % 65536),  // 17 bits
                               static_cast<int>(random.next() % 200) - 120);
    const float exact = g * 126.0f, inf = std::numeric_limits<float>::infinity();
    const float choices[3] = {exact, std::nextafter(exact, 0.0f), std::nextafter(exact, inf)};
    x[first] = choices[first / (3 * mccl::kInt8Block) % 3];
  }
  const uint32_t special[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7F800000u, 0xFF800000u, 0x00000000u,
                              0x80000000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x0B800000u};
  for (size_t k = 0; k < sizeof special / sizeof special[0]; ++k)
    if (1 + k * 37 < count) std::memcpy(&x[1 + k * 37], &special[k], sizeof(float));
  return x;
}

}  // namespace mccl_test
