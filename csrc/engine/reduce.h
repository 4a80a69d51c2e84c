// Element-wise reduction kernels used by the collectives (allreduce, reduce, reduce_scatter).
//
// float16/bfloat16 are computed in float32 and rounded back to nearest-even; integers wrap like two's
// complement; MIN/MAX of floats propagate NaN (torch semantics); bool is bytes 0/1 and the output is
// always exactly 0 or 1. Reductions of 4 MiB or more, and conversions of kSplitConversionsFrom elements or
// more, are split over a small persistent thread pool (reduce_pool.h) into at most `max_parts` parts
// (0: as many as the pool has; 1: none, the calling thread does it all).
// Buffers must either be the same pointer or not overlap at all; a partial overlap throws.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtype.h"

namespace mccl {

// dst[i] = dst[i] OP src[i] for i in [0, count). kAvg reduces like kSum (the caller divides at the end).
// Throws Error kInvalidArgument (message naming op and dtype) when the pair is unsupported.
void reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, size_t max_parts = 0);

// buf[i] /= divisor (for kAvg): floating types divide in float (half types through float32, round to
// nearest even), integer types use truncating integer division (like NCCL); bool is unsupported for avg.
// divisor must be positive.
void divide_by(void* buf, size_t count, DataType dtype, int64_t divisor);

// Wire compression (MCCL_WIRE_DTYPE): float32 to and from `half` (kFloat16 or kBFloat16), rounding to
// nearest even (float16 overflows to +-Inf beyond 65504). round_float32_through(buf) = widen(narrow(buf)),
// in place: what a rank keeps of values it also sends compressed, so every rank holds the same bits.
// From 128 Ki elements (512 KiB of float32) on, the conversions are split: they run on every received
// piece, on the progress thread, where they are most of its work. That is half a compressed ring piece at
// the default MCCL_CHUNK_BYTES (512 KiB on the wire: 256 Ki elements), so full pieces are split down to
// MCCL_CHUNK_BYTES=256K, while the conversions of smaller pieces and messages stay on the calling thread.
constexpr size_t kSplitConversionsFrom = size_t(128) << 10;
void narrow_float32(void* dst, const float* src, size_t count, DataType half, size_t max_parts = 0);
void widen_to_float32(float* dst, const void* src, size_t count, DataType half, size_t max_parts = 0);
void round_float32_through(float* buf, size_t count, DataType half, size_t max_parts = 0);

// The vector instructions the kernels run with in this process, for diagnostics (`mccl doctor`): e.g.
// "avx2 (selected at run time)" on x86-64, "neon (float16 converted in hardware)" on arm64.
const char* reduce_vector_path();

// Whether op is defined for dtype: SUM/AVG/PRODUCT/MIN/MAX for all numeric types; for bool SUM=OR,
// PRODUCT=AND, MIN=AND, MAX=OR, BAND/BOR/BXOR as logical; AVG unsupported for bool; BAND/BOR/BXOR only
// for integer types and bool.
bool op_supported(DataType dtype, ReduceOp op);

}  // namespace mccl
