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

// Runs body over [0, count) in up to `max_parts` parts (0: pool_width()) whose boundaries are multiples of
// `align` elements, the caller doing part 0 and the pool's workers the others at once; false, having run
// nothing, when it cannot split (one part, the pool busy with another thread's call, or inside a part).
// An exception from a part is rethrown here once every part has finished.
bool try_run_parts(size_t count, size_t align, size_t max_parts, const Range& body);

// body(begin, n) over [0, count): split as above from `split_from` elements on, else inline. Below the
// threshold nothing is wrapped or allocated: the data path calls this for every piece and tile.
template <typename Body>
void run_parts(size_t count, size_t split_from, size_t align, size_t max_parts, Body&& body) {
  if (count >= split_from && count > align && max_parts != 1 &&
      try_run_parts(count, align, max_parts, Range(std::ref(body))))
    return;
  body(size_t(0), count);
}

// fn over [0, count) elements of `elem` bytes: run_parts from 4 MiB on.
void run_split(Kernel fn, void* out, const void* a, const void* b, size_t count, size_t elem, int64_t divisor,
               size_t max_parts = 0);

}  // namespace mccl
