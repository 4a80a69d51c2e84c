// The small persistent thread pool that splits a large reduction (4 MiB or more) into parts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mccl {

// A type-erased kernel (reduce.cc's dispatch), so dispatch and threading work on one function-pointer type:
// out[i] = a[i] OP b[i] over n elements, with a or b unused by some kernels.
using Kernel = void (*)(void* out, const void* a, const void* b, size_t n, int64_t divisor);

// fn over [0, count) elements of `elem` bytes: inline below 4 MiB or when the pool is busy, else split
// into parts run by the caller and the pool's workers at once.
void run_split(Kernel fn, void* out, const void* a, const void* b, size_t count, size_t elem, int64_t divisor);

}  // namespace mccl
