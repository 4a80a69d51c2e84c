// The references of test_reduce.cc: every dtype and op, half-precision conversions written independently of
// the engine (via ldexp/nearbyint), typed element access, reference ops in double or exact integer
// arithmetic, and the error-message check. Header-only, for that one test.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "dtype.h"
#include "error.h"
#include "reduce.h"

namespace reduce_reference {

using mccl::DataType;
using mccl::ReduceOp;

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                              DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                              DataType::kInt32,   DataType::kInt64,   DataType::kBool};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProduct, ReduceOp::kMin,
                            ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor};
// The largest count crosses the threaded threshold (4 MiB) for 4- and 8-byte types; under MCCL_TEST_QUICK
// it is 64 Ki + 5 (concurrent_large_reductions still covers the threaded path).
const size_t kLarge = mccl_test::sized((size_t(1) << 20) + 5, (size_t(1) << 16) + 5);
const size_t kCounts[] = {0, 1, 3, 7, 16, 1023, kLarge};

using Bytes = std::vector<unsigned char>;

// ---- Reference half-precision conversions, written independently of reduce.cc (via ldexp/nearbyint).

double fp16_to_double(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 31 ? (m ? std::nan("") : INFINITY)
             : e == 0 ? std::ldexp(m, -24)            // subnormal: m * 2^-24
                      : std::ldexp(1024 + m, e - 25);  // normal: 1.m * 2^(e-15)
  return (h & 0x8000) ? -v : v;
}

// Correctly rounded (nearest even) double -> float16; NaN -> 0x7E00.
uint16_t double_to_fp16(double x) {
  if (std::isnan(x)) return 0x7E00;
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7C00;  // 65520 is the tie between 65504 and 2^16: even is Inf
  if (a < std::ldexp(1.0, -14)) return sign | uint16_t(std::nearbyint(std::ldexp(a, 24)));  // subnormal
  int e;
  std::frexp(a, &e);  // a in [2^(e-1), 2^e)
  double q = std::nearbyint(std::ldexp(a, 11 - e));  // 11 significant bits, in [1024, 2048]
  int biased = e - 1 + 15;
  if (q == 2048) q = 1024, ++biased;
  return sign | uint16_t((biased << 10) | (int(q) - 1024));
}

double bf16_to_double(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Correctly rounded (nearest even) double -> bfloat16; NaN -> 0x7FC0.
uint16_t double_to_bf16(double x) {
  if (std::isnan(x)) return 0x7FC0;
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double a = std::fabs(x);
  if (a >= std::ldexp(2.0 - std::ldexp(1.0, -8), 127)) return sign | 0x7F80;
  if (a < std::ldexp(1.0, -126)) return sign | uint16_t(std::nearbyint(std::ldexp(a, 133)));  // subnormal
  int e;
  std::frexp(a, &e);
  double q = std::nearbyint(std::ldexp(a, 8 - e));  // 8 significant bits, in [128, 256]
  int biased = e - 1 + 127;
  if (q == 256) q = 128, ++biased;
  return sign | uint16_t((biased << 7) | (int(q) - 128));
}

// ---- Typed element access by dtype.

template <typename T>
T get(const Bytes& b, size_t i) {
  T v;
  std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void put(Bytes& b, size_t i, T v) {
  std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
}

double load_float(DataType t, const Bytes& b, size_t i) {
  switch (t) {
    case DataType::kFloat32: return get<float>(b, i);
    case DataType::kFloat64: return get<double>(b, i);
    case DataType::kFloat16: return fp16_to_double(get<uint16_t>(b, i));
    default: return bf16_to_double(get<uint16_t>(b, i));
  }
}
void store_float(DataType t, Bytes& b, size_t i, double v) {
  switch (t) {
    case DataType::kFloat32: return put<float>(b, i, float(v));
    case DataType::kFloat64: return put<double>(b, i, v);
    case DataType::kFloat16: return put<uint16_t>(b, i, double_to_fp16(v));
    default: return put<uint16_t>(b, i, double_to_bf16(v));
  }
}
int64_t load_int(DataType t, const Bytes& b, size_t i) {
  switch (t) {
    case DataType::kInt8: return get<int8_t>(b, i);
    case DataType::kUInt8: return get<uint8_t>(b, i);
    case DataType::kInt32: return get<int32_t>(b, i);
    default: return get<int64_t>(b, i);
  }
}
void store_int(DataType t, Bytes& b, size_t i, int64_t v) {  // truncating, two's complement
  switch (t) {
    case DataType::kInt8: return put<int8_t>(b, i, int8_t(uint8_t(v)));
    case DataType::kUInt8: return put<uint8_t>(b, i, uint8_t(v));
    case DataType::kInt32: return put<int32_t>(b, i, int32_t(uint32_t(v)));
    default: return put<int64_t>(b, i, v);
  }
}

bool is_int(DataType t) { return !mccl::is_floating(t) && t != DataType::kBool; }

// ---- Reference ops.

double ref_float_op(ReduceOp op, double a, double b) {
  bool nan = std::isnan(a) || std::isnan(b);
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin: return nan ? std::nan("") : (a < b ? a : b);
    default: return nan ? std::nan("") : (a > b ? a : b);
  }
}
int64_t ref_int_op(ReduceOp op, int64_t a, int64_t b) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAvg: return int64_t(uint64_t(a) + uint64_t(b));
    case ReduceOp::kProduct: return int64_t(uint64_t(a) * uint64_t(b));
    case ReduceOp::kMin: return a < b ? a : b;
    case ReduceOp::kMax: return a > b ? a : b;
    case ReduceOp::kBand: return a & b;
    case ReduceOp::kBor: return a | b;
    default: return a ^ b;
  }
}
uint8_t ref_bool_op(ReduceOp op, bool a, bool b) {
  switch (op) {
    case ReduceOp::kProduct: case ReduceOp::kMin: case ReduceOp::kBand: return a && b;
    case ReduceOp::kBxor: return a != b;
    default: return a || b;  // sum, max, bor
  }
}

Bytes reference(DataType t, ReduceOp op, const Bytes& a, const Bytes& b, size_t n) {
  Bytes out(a.size());
  for (size_t i = 0; i < n; ++i) {
    if (mccl::is_floating(t)) store_float(t, out, i, ref_float_op(op, load_float(t, a, i), load_float(t, b, i)));
    else if (is_int(t)) store_int(t, out, i, ref_int_op(op, load_int(t, a, i), load_int(t, b, i)));
    else out[i] = ref_bool_op(op, a[i] != 0, b[i] != 0);
  }
  return out;
}

// Index of the first element that differs (bitwise; any NaN equals any NaN), or n.
size_t first_mismatch(DataType t, const Bytes& got, const Bytes& want, size_t n) {
  size_t elem = mccl::dtype_size(t);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got.data() + i * elem, want.data() + i * elem, elem) == 0) continue;
    if (mccl::is_floating(t) && std::isnan(load_float(t, got, i)) && std::isnan(load_float(t, want, i))) continue;
    return i;
  }
  return n;
}

std::string hex(DataType t, const Bytes& b, size_t i) {
  size_t elem = mccl::dtype_size(t);
  std::string s = "0x";
  char buf[4];
  for (size_t k = elem; k-- > 0;) {  // little-endian element, most significant byte first
    std::snprintf(buf, sizeof buf, "%02x", b[i * elem + k]);
    s += buf;
  }
  return s;
}

// Random operands: half types and integers as random bit patterns (all values, NaN/Inf/subnormals
// included); float32/float64 half random bits, half small values whose sums and products need rounding.
Bytes random_buffer(DataType t, size_t n, std::mt19937_64& rng) {
  Bytes b(n * mccl::dtype_size(t));
  std::uniform_real_distribution<double> small(-10.0, 10.0);
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits = rng();
    switch (t) {
      case DataType::kFloat32:
        if (bits & 1) put<float>(b, i, float(small(rng)));
        else put<uint32_t>(b, i, uint32_t(bits >> 32));
        break;
      case DataType::kFloat64:
        if (bits & 1) put<double>(b, i, small(rng));
        else put<uint64_t>(b, i, rng());
        break;
      case DataType::kBool: b[i] = bits & 1; break;
      default: std::memcpy(b.data() + i * mccl::dtype_size(t), &bits, mccl::dtype_size(t));
    }
  }
  return b;
}

// out = a OP b through reduce_into, on a copy of a.
void reduce_copy(void* out, const void* a, const void* b, size_t n, DataType t, ReduceOp op) {
  std::memcpy(out, a, n * mccl::dtype_size(t));
  mccl::reduce_into(out, b, n, t, op);
}

// Runs op(a, b) through reduce_into and checks it against the reference.
void check_pair(DataType t, ReduceOp op, const Bytes& a, const Bytes& b, size_t n, const char* label) {
  Bytes want = reference(t, op, a, b, n);
  Bytes got = a;
  mccl::reduce_into(got.data(), b.data(), n, t, op);
  size_t i = first_mismatch(t, got, want, n);
  CHECK_MSG(i == n, "%s %s %s n=%zu: element %zu: a=%s b=%s got %s want %s", label, mccl::dtype_name(t),
            mccl::op_name(op), n, i, hex(t, a, i).c_str(), hex(t, b, i).c_str(), hex(t, got, i).c_str(),
            hex(t, want, i).c_str());
}

Bytes halves(std::initializer_list<uint16_t> v) {
  Bytes b(v.size() * 2);
  std::memcpy(b.data(), v.begin(), b.size());
  return b;
}

template <typename T>
Bytes typed(std::initializer_list<T> v) {
  Bytes b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.begin(), b.size());
  return b;
}

template <typename F>
void expect_invalid(F&& f, std::initializer_list<const char*> words, const char* label) {
  try {
    f();
    CHECK_MSG(false, "%s: no exception", label);
  } catch (const mccl::Error& e) {
    CHECK_MSG(e.kind() == mccl::Error::Kind::kInvalidArgument, "%s: wrong kind: %s", label, e.what());
    for (const char* w : words) {
      CHECK_MSG(std::string(e.what()).find(w) != std::string::npos, "%s: '%s' not in: %s", label, w, e.what());
    }
  }
}

}  // namespace reduce_reference
