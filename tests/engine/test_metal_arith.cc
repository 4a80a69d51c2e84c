// The Metal kernels' arithmetic (src/lightning_mccl/metal/reduce_arith.h, compiled here as C++) against
// the engine's CPU reducer, bit for bit: random bit patterns (so NaN, Inf, subnormals and signed zeros
// all occur), odd lengths, and the conversions over a sweep of float32 values. Any NaN matches any NaN
// (the CPU reducer on arm64 keeps a NaN's payload where the header makes it 0x7E00).
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../../src/lightning_mccl/metal/reduce_arith.h"
#include "check.h"
#include "reduce.h"

namespace {

using mccl::DataType;
using mccl::ReduceOp;

struct OpCase {
  ReduceOp op;
  int code;
};
const OpCase kOps[] = {{ReduceOp::kSum, MCCL_OP_SUM}, {ReduceOp::kAvg, MCCL_OP_SUM},
                       {ReduceOp::kProduct, MCCL_OP_PRODUCT}, {ReduceOp::kMin, MCCL_OP_MIN},
                       {ReduceOp::kMax, MCCL_OP_MAX}};
const size_t kLengths[] = {1, 3, 7, 1023, 4099};

bool is_nan(DataType t, uint32_t bits) {
  if (t == DataType::kFloat32) return (bits & 0x7FFFFFFFu) > 0x7F800000u;
  if (t == DataType::kFloat16) return (bits & 0x7FFFu) > 0x7C00u;
  return (bits & 0x7FFFu) > 0x7F80u;  // bfloat16
}

// Element i of a float32 or 16-bit buffer, as bits.
uint32_t bits_at(DataType t, const std::vector<unsigned char>& b, size_t i) {
  if (t == DataType::kFloat32) {
    uint32_t u;
    std::memcpy(&u, b.data() + 4 * i, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return h;
}

uint32_t header_reduce(DataType t, int code, uint32_t a, uint32_t b) {
  if (t == DataType::kFloat32) return mccl_as_bits(mccl_reduce_f32(code, mccl_as_float(a), mccl_as_float(b)));
  if (t == DataType::kFloat16) return mccl_reduce_f16(code, mccl_u16(a), mccl_u16(b));
  return mccl_reduce_bf16(code, mccl_u16(a), mccl_u16(b));
}

// Random bits, with one element in eight drawn from special values (zeros, infinities, NaN, extremes).
std::vector<unsigned char> random_bits(DataType t, size_t n, std::mt19937_64& rng) {
  const uint32_t special32[] = {0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x00000001u,
                                0x007FFFFFu, 0x7F7FFFFFu, 0x3F800000u, 0x33000000u};
  const uint32_t special16[] = {0, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x03FF, 0x7BFF, 0x3C00, 0x7F80};
  size_t elem = mccl::dtype_size(t);
  std::vector<unsigned char> out(n * elem);
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = rng();
    uint32_t v = uint32_t(r);
    if ((r >> 32) % 8 == 0) v = elem == 4 ? special32[(r >> 40) % 10] : special16[(r >> 40) % 10];
    std::memcpy(out.data() + i * elem, &v, elem);  // little-endian: the low bytes
  }
  return out;
}

}  // namespace

TEST(header_matches_cpu_reducer_on_every_op_and_type) {
  std::mt19937_64 rng(2024);
  for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    for (const OpCase& k : kOps) {
      for (size_t n : kLengths) {
        auto a = random_bits(t, n, rng), b = random_bits(t, n, rng), cpu = a;
        mccl::reduce_into(cpu.data(), b.data(), n, t, k.op);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          uint32_t want = bits_at(t, cpu, i), got = header_reduce(t, k.code, bits_at(t, a, i), bits_at(t, b, i));
          bool same = got == want || (is_nan(t, got) && is_nan(t, want));
          if (!same && bad++ < 3)
            std::fprintf(stderr, "  %s %s n=%zu i=%zu: a=0x%x b=0x%x cpu=0x%x header=0x%x\n", mccl::dtype_name(t),
                         mccl::op_name(k.op), n, i, bits_at(t, a, i), bits_at(t, b, i), want, got);
        }
        CHECK_MSG(bad == 0, "%s %s n=%zu: %zu elements differ", mccl::dtype_name(t), mccl::op_name(k.op), n, bad);
      }
    }
  }
}

TEST(conversions_match_the_cpu_codecs) {
  // Every float16 and bfloat16 value widens like the CPU reducer's codec.
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = uint16_t(h);
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<float> wide(all.size());
    mccl::widen_to_float32(wide.data(), all.data(), all.size(), t);
    size_t bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) {
      float got = t == DataType::kFloat16 ? mccl_f16_to_f32(uint16_t(h)) : mccl_bf16_to_f32(uint16_t(h));
      bool same = mccl_as_bits(got) == mccl_as_bits(wide[h]) || (std::isnan(got) && std::isnan(wide[h]));
      bad += !same;
    }
    CHECK_MSG(bad == 0, "widening %s: %zu of 65536 differ", mccl::dtype_name(t), bad);
  }
  // A sweep over float32 bit patterns (a stride coprime to 2^32 hits every exponent) narrows the same.
  std::vector<float> sweep;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += mccl_test::sized(4093, 65521)) sweep.push_back(mccl_as_float(uint32_t(u)));
  for (uint32_t edge : {0x477FF000u, 0x477FEFFFu, 0x33000000u, 0x33000001u, 0x387FE000u, 0x387FF000u})
    sweep.push_back(mccl_as_float(edge));  // the Inf tie, just below it, 2^-25, the subnormal/normal ties
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<uint16_t> narrow(sweep.size());
    mccl::narrow_float32(narrow.data(), sweep.data(), sweep.size(), t);
    size_t bad = 0;
    for (size_t i = 0; i < sweep.size(); ++i) {
      uint16_t got = t == DataType::kFloat16 ? mccl_f32_to_f16(sweep[i]) : mccl_f32_to_bf16(sweep[i]);
      bad += !(got == narrow[i] || (is_nan(t, got) && is_nan(t, narrow[i])));
    }
    CHECK_MSG(bad == 0, "narrowing %s: %zu of %zu differ", mccl::dtype_name(t), bad, sweep.size());
  }
}

MCCL_TEST_MAIN
