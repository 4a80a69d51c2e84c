// The 8-bit allreduce's stated error bounds (csrc/engine/algorithms/int8_ring.cc, docs/int8.md), computed per
// block from the inputs in float64, for the tests to hold the results to: the exchange's (each contribution
// encoded once, the sum once) and the ring's (the same, and every partial sum along the ring once more).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

#include "int8_blocks.h"

namespace mccl_test {

// Rank `rank`'s value `i`.
using Values = std::function<float(int rank, size_t i)>;

// One encoding's error is at most c times its block's largest finite magnitude.
constexpr double kInt8C = (1 + 0x1.0p-16) / 252.0;
constexpr double kF32Rounding = 0x1.0p-24;  // one float32 addition's relative error

struct Int8Bound {
  std::vector<double> of_block;  // per block of 256 values, in the units of the sum
  std::vector<double> hops;      // the ring's requantisations alone (the part error feedback does not cover)
  double at(size_t i) const { return of_block[i / mccl::kInt8Block]; }
};

// The bound of every block of an allreduce of `count` values on `world` ranks. With `ring`, segment k's partial
// sums run through ranks k+1, k+2, ..., k-1 and end at k (int8_ring.cc): the j-th (j+1 contributions) is
// encoded with error at most c M_j, M_j bounded by the float64 partial sum's largest magnitude plus the errors
// before it. Without, only the sum is encoded (the exchange). Finite values only (the caller skips the others).
inline Int8Bound int8_bound(int world, size_t count, const Values& value, bool ring) {
  const size_t blocks = (count + mccl::kInt8Block - 1) / mccl::kInt8Block;
  Int8Bound out{std::vector<double>(blocks, 0.0), std::vector<double>(blocks, 0.0)};
  std::vector<double> partial;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t first = b * mccl::kInt8Block, n = std::min(mccl::kInt8Block, count - first);
    int owner = 0;  // the rank whose segment holds the block
    while (mccl::int8_segment(count, owner, world).first + mccl::int8_segment(count, owner, world).count <= first)
      ++owner;
    std::vector<double> largest(world, 0.0);
    for (int m = 0; m < world; ++m)
      for (size_t i = 0; i < n; ++i) {
        const double v = value(m, first + i);
        if (std::isfinite(v)) largest[m] = std::max(largest[m], std::fabs(v));
      }
    double encoded = 0;  // the first encodings so far
    double later = 0;    // the errors of the sums' encodings and float32's rounding so far
    partial.assign(n, 0.0);
    for (int j = 0; j < world; ++j) {
      const int m = ring ? (owner + 1 + j) % world : (owner + j) % world;
      double exact = 0;
      for (size_t i = 0; i < n; ++i) {
        const double v = value(m, first + i);
        if (std::isfinite(v)) partial[i] += v;
        exact = std::max(exact, std::fabs(partial[i]));
      }
      encoded += kInt8C * largest[m];
      if (j == 0) continue;
      const double sum_bound = exact + encoded + later;  // M_j
      later += kF32Rounding * sum_bound;
      if (j + 1 == world) later += kF32Rounding * sum_bound;  // AVG's division
      if (ring || j + 1 == world) {
        later += kInt8C * sum_bound;
        if (j + 1 < world) out.hops[b] += kInt8C * sum_bound;
      }
    }
    out.of_block[b] = encoded + later;
  }
  return out;
}

}  // namespace mccl_test
