// The 8-bit wire format (WireType::kInt8Blocks, docs/int8.md): float32 values in blocks of kInt8Block. On the
// wire a block is its float32 scale s, then one int8 code per value; a value is code * s.
//
// s is the smallest float with 17 significant bits that is at least M / 126, M the block's largest finite
// magnitude (but at most 0x1.041p+121, the largest whose 126 s is finite): code * s is then exact for every code, and encoding a decoded block again gives the same bytes (a
// rank that keeps what it sends holds what its receivers decode). Codes are x * (1 / s), each product rounded
// to float32, then to the nearest integer (ties to even), within -126..126; the other three codes carry what no
// scale may hide: -128 NaN, 127 +Inf, -127 -Inf. A block whose M is below 2^-100 travels as zeros (s = 0).
// Error of a finite value: at most s / 2 <= M / 252 * (1 + 2^-16).
//
// Every step is exact or one IEEE operation rounded to nearest (a product, a quotient), so torch ops on any
// device produce the same bytes (csrc/torch/int8_codec.cpp, tests/torch/test_int8_codec.py): the encoder here
// rounds with nearbyint, never through a sum a compiler could fuse with the product.
#pragma once

#include <cstddef>

namespace mccl {

constexpr size_t kInt8Block = 256;
// Bytes on the wire of `count` values: every block its scale and its codes (the last block may be shorter).
constexpr size_t int8_wire_bytes(size_t count) { return count + 4 * ((count + kInt8Block - 1) / kInt8Block); }

// Conversions of whole runs of blocks (the first value of `src`/`dst` starts a block). From
// kSplitConversionsFrom values on they are split over the reduction pool into at most `max_parts` parts
// (reduce.h), element-wise the same work, so the same bytes.
void int8_encode(char* wire, const float* src, size_t count, size_t max_parts = 0);
void int8_decode(float* dst, const char* wire, size_t count, size_t max_parts = 0);
// data = decode(encode(data)) in place.
void int8_round(float* data, size_t count, size_t max_parts = 0);

// The 8-bit allreduce's split of `count` values over `parts` ranks (algorithms/int8_allreduce.cc): whole blocks, as
// evenly as possible (the first parts get one more), so every segment's blocks are blocks of the whole buffer.
struct ValueRange {
  size_t first = 0;
  size_t count = 0;
};
ValueRange int8_segment(size_t count, int part, int parts);

}  // namespace mccl
