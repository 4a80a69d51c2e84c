// The small persistent thread pool that splits element-wise work (a large reduction, the conversions of a
// compressed piece) into parts that run at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace mccl {

// A type-erased kernel (reduce.cc's dispatch), so dispatch and threading work on one function-pointer type:
// out[i] = a[i] OP b[i] over n elements, with a or b unused by some kernels.
using Kernel = void (*)(void* out, const void* a, const void* b, size_t n, int64_t divisor);

// Work on the elements [begin, begin + n) of a range.
using Range = std::function<void(size_t begin, size_t n)>;

// The most parts one call is split into: the calling thread and the pool's workers.
size_t pool_width();

// body over [0, count): from `split_from` elements on, in up to `max_parts` parts (0: pool_width()) whose
// boundaries are multiples of `align` elements, run by the caller (part 0) and the pool's workers at once;
// inline when smaller, when max_parts is 1, or when the pool is busy with another thread's call.
void run_parts(size_t count, size_t split_from, size_t align, size_t max_parts, const Range& body);

// fn over [0, count) elements of `elem` bytes: run_parts from 4 MiB on.
void run_split(Kernel fn, void* out, const void* a, const void* b, size_t count, size_t elem, int64_t divisor,
               size_t max_parts = 0);

}  // namespace mccl
