// Test inputs that are pure functions of (rank, index), so every check can recompute any rank's values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mccl_test {

// Uniform in [-4, 4): splitmix64 of the pair, so each element costs a few multiplications (a generator
// seeded per element made the tests slow under the sanitizers).
inline float input(int rank, size_t i) {
  uint64_t z = (static_cast<uint64_t>(rank) << 40) + i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 8.0 - 4.0);
}

}  // namespace mccl_test
