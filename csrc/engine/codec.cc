#include "codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "error.h"
#include "int8_blocks.h"
#include "reduce.h"
#include "reduce_pool.h"

namespace mccl {

bool is_wire_type(uint8_t value) {
  switch (static_cast<WireType>(value)) {
    case WireType::kExact: case WireType::kFloat16: case WireType::kBFloat16: case WireType::kInt8Blocks: return true;
  }
  return false;
}

const char* wire_format_name(WireType type) {
  switch (type) {
    case WireType::kExact: return "uncompressed";
    case WireType::kFloat16: return "float16";
    case WireType::kBFloat16: return "bfloat16";
    case WireType::kInt8Blocks: return "int8 blocks";
  }
  return "an unknown wire type";
}

WireType wire_type_of_setting(DataType wire_dtype) {
  switch (wire_dtype) {
    case DataType::kFloat16: return WireType::kFloat16;
    case DataType::kBFloat16: return WireType::kBFloat16;
    default: return WireType::kExact;
  }
}

namespace {

// Data that travels as it is, of any dtype.
class Exact final : public Codec {
 public:
  Exact(DataType dtype, ReduceOp op, int world, size_t threads)
      : dtype_(dtype), op_(op), world_(world), threads_(threads), esize_(dtype_size(dtype)) {}
  bool in_place() const override { return true; }
  size_t wire_bytes(size_t count) const override { return count * esize_; }
  size_t piece_elements(size_t chunk_bytes) const override { return std::max<size_t>(1, chunk_bytes / esize_); }
  void encode(char* wire, const void* data, size_t count, float*) const override {
    if (count) std::memcpy(wire, data, count * esize_);
  }
  void decode(void* data, const char* wire, size_t count) const override {
    if (count) std::memcpy(data, wire, count * esize_);
  }
  // The result is sent from dst itself (in_place), so an onward encoding is never asked for.
  void reduce(void* dst, const char* wire, size_t count, const Fold& fold) const override {
    if (fold.own && fold.own != dst && count) std::memcpy(dst, fold.own, count * esize_);  // one piece: in cache
    reduce_into(dst, wire, count, dtype_, op_, threads_);
    if (fold.final && op_ == ReduceOp::kAvg) divide_by(dst, count, dtype_, world_);
  }
  void round(void*, size_t) const override {}

 private:
  const DataType dtype_;
  const ReduceOp op_;
  const int world_;
  const size_t threads_;
  const size_t esize_;
};

// bfloat16 or float16 elements (MCCL_WIRE_DTYPE), rounded to nearest even (reduce.h's conversions).
struct HalfFormat {
  DataType half;
  static constexpr size_t kUnit = 1;  // elements encoded together
  size_t wire_bytes(size_t count) const { return count * 2; }
  size_t wire_offset(size_t element) const { return element * 2; }
  void encode(char* wire, const float* src, size_t count, size_t threads) const {
    narrow_float32(wire, src, count, half, threads);
  }
  void decode(float* dst, const char* wire, size_t count, size_t threads) const {
    widen_to_float32(dst, wire, count, half, threads);
  }
  void round(float* data, size_t count, size_t threads) const { round_float32_through(data, count, half, threads); }
};

// The 8-bit blocks of int8_blocks.h: a unit is a block, so tiles and thread parts are whole blocks and a
// piece's blocks start at its first value.
struct Int8Format {
  static constexpr size_t kUnit = kInt8Block;
  size_t wire_bytes(size_t count) const { return int8_wire_bytes(count); }
  size_t wire_offset(size_t element) const { return int8_wire_bytes(element); }
  void encode(char* wire, const float* src, size_t count, size_t threads) const {
    int8_encode(wire, src, count, threads);
  }
  void decode(float* dst, const char* wire, size_t count, size_t threads) const {
    int8_decode(dst, wire, count, threads);
  }
  void round(float* data, size_t count, size_t threads) const { int8_round(data, count, threads); }
};

// float32 data in a narrower Format. Pieces are worked on in tiles that stay in L1 between the conversion and
// the arithmetic, one pass over memory; whole tiles are shared out over the reduce threads (MCCL_REDUCE_THREADS),
// element-wise, so the bits do not depend on how many there are.
template <class Format>
class Narrowing final : public Codec {
 public:
  static constexpr size_t kTile = 4096;  // floats: 16 KiB
  static_assert(kTile % Format::kUnit == 0, "a tile holds whole units");

  Narrowing(Format format, ReduceOp op, int world, size_t threads)
      : format_(format), op_(op), world_(world), threads_(threads) {}

  size_t wire_bytes(size_t count) const override { return format_.wire_bytes(count); }
  size_t piece_elements(size_t chunk_bytes) const override {
    const size_t units = chunk_bytes / format_.wire_bytes(Format::kUnit);
    return std::max<size_t>(1, units) * Format::kUnit;
  }
  void encode(char* wire, const void* data, size_t count, float* error) const override {
    const float* src = static_cast<const float*>(data);
    if (!error) return format_.encode(wire, src, count, threads_);
    in_tiles(count, [&](size_t i, size_t n) {
      float* x = error + i;  // holds the values to encode, then their error
      for (size_t k = 0; k < n; ++k) x[k] += src[i + k];
      encode_keeping_error(wire + format_.wire_offset(i), x, n, x, 1, false);
    });
  }
  void decode(void* data, const char* wire, size_t count) const override {
    format_.decode(static_cast<float*>(data), wire, count, threads_);
  }
  void reduce(void* dst, const char* wire, size_t count, const Fold& fold) const override {
    float* out = static_cast<float*>(dst);
    const float* own = fold.own != dst ? static_cast<const float*>(fold.own) : nullptr;
    const int divisor = fold.final && op_ == ReduceOp::kAvg ? world_ : 1;
    in_tiles(count, [&](size_t i, size_t n) {
      alignas(64) float tile[kTile];
      format_.decode(tile, wire + format_.wire_offset(i), n, 1);
      if (own) std::memcpy(out + i, own + i, n * sizeof(float));
      reduce_into(out + i, tile, n, DataType::kFloat32, op_, 1);
      if (divisor > 1) divide_by(out + i, n, DataType::kFloat32, divisor);
      if (!fold.onward) return;
      char* onward = fold.onward + format_.wire_offset(i);
      if (fold.error) encode_keeping_error(onward, out + i, n, fold.error + i, divisor, true);
      else format_.encode(onward, out + i, n, 1);
      if (fold.final) format_.decode(out + i, onward, n, 1);
    });
  }
  void round(void* data, size_t count) const override { format_.round(static_cast<float*>(data), count, threads_); }

 private:
  // body(first, n) over [0, count) in tiles, whole tiles per thread.
  template <typename Body>
  void in_tiles(size_t count, Body&& body) const {
    run_parts(count, kSplitConversionsFrom, kTile, threads_, [&](size_t begin, size_t len) {
      for (size_t i = begin; i < begin + len; i += kTile) body(i, std::min(kTile, begin + len - i));
    });
  }
  // Encodes x (one tile), and sets (or with `add`, adds to) `error` (which may be x) what the receivers lose of
  // it, times `scale` (the divisor an AVG applied to x, so that the error is in the units of the sum); nothing
  // where x is not finite (a NaN or Inf travels as itself and must not come back in the next call).
  void encode_keeping_error(char* wire, const float* x, size_t n, float* error, int scale, bool add) const {
    alignas(64) float back[kTile];
    format_.encode(wire, x, n, 1);
    format_.decode(back, wire, n, 1);
    const float s = static_cast<float>(scale);
    for (size_t k = 0; k < n; ++k) {
      const float lost = std::isfinite(x[k]) ? (x[k] - back[k]) * s : 0.0f;
      error[k] = add ? error[k] + lost : lost;
    }
  }

  const Format format_;
  const ReduceOp op_;
  const int world_;
  const size_t threads_;
};

}  // namespace

uint64_t wire_bytes_of(WireType type, DataType dtype, uint64_t count) {
  switch (type) {
    case WireType::kFloat16: case WireType::kBFloat16: return HalfFormat{}.wire_bytes(count);
    case WireType::kInt8Blocks: return int8_wire_bytes(count);
    default: return count * dtype_size(dtype);
  }
}

std::unique_ptr<Codec> Codec::make(WireType type, DataType dtype, ReduceOp op, int world, size_t threads) {
  if (dtype != DataType::kFloat32 || type == WireType::kExact) return std::make_unique<Exact>(dtype, op, world, threads);
  switch (type) {
    case WireType::kFloat16: case WireType::kBFloat16:
      return std::make_unique<Narrowing<HalfFormat>>(HalfFormat{static_cast<DataType>(type)}, op, world, threads);
    case WireType::kInt8Blocks:
      return std::make_unique<Narrowing<Int8Format>>(Int8Format{}, op, world, threads);
    default: break;
  }
  fail(Error::Kind::kInvalidArgument, "no codec for wire type ", int(type));
}

}  // namespace mccl
