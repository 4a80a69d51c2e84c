// A float32's bits and back, and a select on bits, for the branch-free conversions of the element loops
// (reduce_kernels.h, int8_blocks.cc).
#pragma once

#include <cstdint>
#include <cstring>

namespace mccl {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// c ? x : y through a mask. With a plain ?: g++ (-ftrapping-math) sinks the float arithmetic feeding only
// one side into a branch, which it then may not if-convert, and the loop stays scalar.
inline uint32_t select_bits(bool c, uint32_t x, uint32_t y) {
  uint32_t mask = 0u - uint32_t(c);
  return (x & mask) | (y & ~mask);
}

}  // namespace mccl
