// Tests for the reduction kernels (reduce.h): every supported dtype x op pair against a reference computed
// in double (or exact wrapping integer arithmetic), plus the edge cases: aliasing, NaN, half rounding,
// integer wraparound, divide_by, the support table and the errors.
#include "reduce.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "dtype.h"
#include "error.h"
#include "reduce_pool.h"
#include "reduce_reference.h"

using namespace reduce_reference;

TEST(every_dtype_op_and_count_matches_reference) {
  std::mt19937_64 rng(12345);
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (!mccl::op_supported(t, op)) continue;
      for (size_t n : kCounts) {
        Bytes a = random_buffer(t, n, rng), b = random_buffer(t, n, rng);
        check_pair(t, op, a, b, n, "random");
      }
    }
  }
}

TEST(dst_equal_to_src_reduces_with_itself) {
  std::mt19937_64 rng(7);
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (!mccl::op_supported(t, op)) continue;
      for (size_t n : {size_t(37), kLarge}) {
        Bytes a = random_buffer(t, n, rng);
        Bytes want_self = reference(t, op, a, a, n);
        Bytes w = a;
        mccl::reduce_into(w.data(), w.data(), n, t, op);
        CHECK_MSG(first_mismatch(t, w, want_self, n) == n, "dst==src %s %s n=%zu", mccl::dtype_name(t),
                  mccl::op_name(op), n);
      }
    }
  }
}

TEST(operand_order_is_dst_then_src) {
  // min/max of +0 and -0 returns the second operand: reduce_into computes dst OP src, src second.
  Bytes a = typed<float>({0.0f, -0.0f}), b = typed<float>({-0.0f, 0.0f});
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    Bytes x = a;
    mccl::reduce_into(x.data(), b.data(), 2, DataType::kFloat32, op);
    CHECK(x == b);
  }
}

TEST(unaligned_buffers) {
  std::mt19937_64 rng(99);
  for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kInt64}) {
    size_t elem = mccl::dtype_size(t);
    for (size_t off = 1; off < 4; ++off) {
      size_t n = 517;
      Bytes a = random_buffer(t, n + off, rng), b = random_buffer(t, n + off, rng);
      Bytes want = reference(t, ReduceOp::kSum, a, b, n + off);
      size_t skip = off * elem;
      mccl::reduce_into(a.data() + skip, b.data() + skip, n, t, ReduceOp::kSum);
      auto tail = [&](const Bytes& x) { return Bytes(x.begin() + skip, x.end()); };
      CHECK_MSG(first_mismatch(t, tail(a), tail(want), n) == n, "%s reduce_into +%zu", mccl::dtype_name(t), off);
    }
  }
}

TEST(nan_propagates_through_min_and_max) {
  const double qnan = std::nan("");
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    size_t n = 6;
    Bytes a(n * mccl::dtype_size(t)), b(a.size());
    double av[] = {qnan, 1.0, qnan, -INFINITY, INFINITY, qnan};
    double bv[] = {1.0, qnan, qnan, qnan, qnan, -INFINITY};
    for (size_t i = 0; i < n; ++i) store_float(t, a, i, av[i]), store_float(t, b, i, bv[i]);
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum, ReduceOp::kProduct}) {
      Bytes out(a.size()), into = a;
      reduce_copy(out.data(), a.data(), b.data(), n, t, op);
      mccl::reduce_into(into.data(), b.data(), n, t, op);
      for (size_t i = 0; i < n; ++i) {
        const char* dt = mccl::dtype_name(t);
        CHECK_MSG(std::isnan(load_float(t, out, i)), "copy %s %s element %zu", dt, mccl::op_name(op), i);
        CHECK_MSG(std::isnan(load_float(t, into, i)), "reduce_into %s %s element %zu", dt, mccl::op_name(op), i);
      }
    }
  }
}

TEST(bfloat16_rounds_ties_to_even_and_keeps_nan) {
  // 1 + 2^-8 is halfway between 1 (even) and 1 + 2^-7: rounds down; (1 + 2^-7) + 2^-8 rounds up to 1 + 2^-6.
  Bytes a = halves({0x3F80, 0x3F81, 0xBF80, 0xBF81, 0x7F7F, 0x3F80});
  Bytes b = halves({0x3B80, 0x3B80, 0xBB80, 0xBB80, 0x7F7F, 0x3380});  // last: 2^-24, far below half an ulp
  Bytes out(a.size());
  reduce_copy(out.data(), a.data(), b.data(), 6, DataType::kBFloat16, ReduceOp::kSum);
  CHECK(out == halves({0x3F80, 0x3F82, 0xBF80, 0xBF82, 0x7F80, 0x3F80}));  // max + max overflows to Inf
  // NaN payloads of every shape stay NaN (a naive +0x7FFF rounding could carry a NaN into Inf or -0).
  Bytes nans = halves({0x7F81, 0x7FC0, 0xFFFF, 0x7FFF, 0xFF81});
  Bytes ones = halves({0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80});
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    Bytes r(nans.size());
    reduce_copy(r.data(), nans.data(), ones.data(), 5, DataType::kBFloat16, op);
    for (size_t i = 0; i < 5; ++i) {
      CHECK_MSG(std::isnan(bf16_to_double(get<uint16_t>(r, i))), "op %s element %zu", mccl::op_name(op), i);
    }
  }
  Bytes d = nans;
  mccl::divide_by(d.data(), 5, DataType::kBFloat16, 3);
  for (size_t i = 0; i < 5; ++i) CHECK(std::isnan(bf16_to_double(get<uint16_t>(d, i))));
}

TEST(float16_subnormals_and_infinities) {
  Bytes a = halves({0x0001, 0x03FF, 0x0001, 0x0003, 0x7BFF, 0x7BFF, 0x7C00, 0x7C00, 0xFBFF, 0x8001});
  Bytes b = halves({0x0001, 0x0001, 0x3800, 0x3800, 0x4C00, 0x4800, 0xFC00, 0x3C00, 0xCC00, 0x0001});
  // sums: 2 subnormals; largest subnormal + smallest -> smallest normal; 65504 + 16 = tie -> Inf;
  // 65504 + 8 -> 65504; Inf + -Inf = NaN; Inf + 1 = Inf; -65504 - 16 -> -Inf; -tiny + tiny = +0.
  Bytes sum(a.size());
  reduce_copy(sum.data(), a.data(), b.data(), 10, DataType::kFloat16, ReduceOp::kSum);
  uint16_t want_sum[] = {0x0002, 0x0400, 0x3800, 0x3800, 0x7C00, 0x7BFF, 0x7E00, 0x7C00, 0xFC00, 0x0000};
  for (size_t i = 0; i < 10; ++i) {
    uint16_t got = get<uint16_t>(sum, i);
    bool ok = i == 6 ? std::isnan(fp16_to_double(got)) : got == want_sum[i];
    CHECK_MSG(ok, "sum element %zu: got 0x%04x want 0x%04x", i, got, want_sum[i]);
  }
  // products with 0.5: smallest subnormal * 0.5 is a tie between 0 and 2^-24 -> 0 (even);
  // 3 * 2^-24 * 0.5 is a tie between 1 and 2 (x 2^-24) -> 2.
  Bytes prod(a.size());
  reduce_copy(prod.data(), a.data(), b.data(), 4, DataType::kFloat16, ReduceOp::kProduct);
  CHECK(get<uint16_t>(prod, 0) == 0x0000);
  CHECK(get<uint16_t>(prod, 1) == 0x0000);  // 1023*2^-24 * 2^-24
  CHECK(get<uint16_t>(prod, 2) == 0x0000);
  CHECK(get<uint16_t>(prod, 3) == 0x0002);
}

TEST(half_types_exhaustive_identity_and_rounding) {
  // Every bit pattern times 1.0 must come back unchanged (NaN stays NaN), and x / 3 must be correctly rounded.
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    const size_t n = 65536;
    Bytes all(n * 2), one(n * 2), out(n * 2);
    uint16_t unit = t == DataType::kFloat16 ? 0x3C00 : 0x3F80;
    for (size_t i = 0; i < n; ++i) put<uint16_t>(all, i, uint16_t(i)), put<uint16_t>(one, i, unit);
    reduce_copy(out.data(), all.data(), one.data(), n, t, ReduceOp::kProduct);
    size_t bad = first_mismatch(t, out, all, n);
    CHECK_MSG(bad == n, "%s x*1 at 0x%04zx: got %s", mccl::dtype_name(t), bad, hex(t, out, bad).c_str());
    Bytes div = all, want(n * 2);
    mccl::divide_by(div.data(), n, t, 3);
    for (size_t i = 0; i < n; ++i) store_float(t, want, i, load_float(t, all, i) / 3.0);
    bad = first_mismatch(t, div, want, n);
    CHECK_MSG(bad == n, "%s /3 at 0x%04zx: got %s want %s", mccl::dtype_name(t), bad, hex(t, div, bad).c_str(),
              hex(t, want, bad).c_str());
  }
}

TEST(integers_wrap_around) {
  auto run = [](DataType t, ReduceOp op, Bytes a, const Bytes& b, const Bytes& want) {
    Bytes out(a.size());
    size_t n = a.size() / mccl::dtype_size(t);
    reduce_copy(out.data(), a.data(), b.data(), n, t, op);
    mccl::reduce_into(a.data(), b.data(), n, t, op);
    CHECK_MSG(out == want && a == want, "%s %s", mccl::dtype_name(t), mccl::op_name(op));
  };
  const int64_t i64min = std::numeric_limits<int64_t>::min(), i64max = std::numeric_limits<int64_t>::max();
  const int32_t i32min = std::numeric_limits<int32_t>::min(), i32max = std::numeric_limits<int32_t>::max();
  using I8 = int8_t;
  using U8 = uint8_t;
  using I32 = int32_t;
  using I64 = int64_t;
  const ReduceOp sum = ReduceOp::kSum, prod = ReduceOp::kProduct;
  run(DataType::kInt8, sum, typed<I8>({127, -128, 100}), typed<I8>({1, -1, 100}), typed<I8>({-128, 127, -56}));
  run(DataType::kUInt8, sum, typed<U8>({255, 200}), typed<U8>({1, 100}), typed<U8>({0, 44}));
  run(DataType::kInt32, sum, typed<I32>({i32max, i32min}), typed<I32>({1, -1}), typed<I32>({i32min, i32max}));
  run(DataType::kInt64, sum, typed<I64>({i64max, i64min}), typed<I64>({1, -1}), typed<I64>({i64min, i64max}));
  run(DataType::kInt8, prod, typed<I8>({16, -128, 127}), typed<I8>({16, -1, 127}), typed<I8>({0, -128, 1}));
  run(DataType::kUInt8, prod, typed<U8>({255, 16}), typed<U8>({255, 16}), typed<U8>({1, 0}));
  run(DataType::kInt32, prod, typed<I32>({65536, i32min}), typed<I32>({65536, -1}), typed<I32>({0, i32min}));
  const I64 two32 = I64(1) << 32;
  run(DataType::kInt64, prod, typed<I64>({i64min, two32}), typed<I64>({-1, two32}), typed<I64>({i64min, 0}));
}

TEST(bool_outputs_are_zero_or_one) {
  Bytes a = {0, 2, 255, 1, 0}, b = {0, 0, 3, 128, 7};
  struct Want { ReduceOp op; Bytes v; };
  const Want wants[] = {{ReduceOp::kSum, {0, 1, 1, 1, 1}},     {ReduceOp::kMax, {0, 1, 1, 1, 1}},
                        {ReduceOp::kBor, {0, 1, 1, 1, 1}},     {ReduceOp::kProduct, {0, 0, 1, 1, 0}},
                        {ReduceOp::kMin, {0, 0, 1, 1, 0}},     {ReduceOp::kBand, {0, 0, 1, 1, 0}},
                        {ReduceOp::kBxor, {0, 1, 0, 0, 1}}};
  for (const Want& w : wants) {
    Bytes out(5), into = a;
    reduce_copy(out.data(), a.data(), b.data(), 5, DataType::kBool, w.op);
    mccl::reduce_into(into.data(), b.data(), 5, DataType::kBool, w.op);
    CHECK_MSG(out == w.v && into == w.v, "bool %s", mccl::op_name(w.op));
  }
}

TEST(divide_by_every_type) {
  std::mt19937_64 rng(3);
  for (DataType t : kAllTypes) {
    if (t == DataType::kBool) continue;
    for (int64_t d : {int64_t(1), int64_t(2), int64_t(3), int64_t(7), int64_t(1000)}) {
      for (size_t n : {size_t(0), size_t(1), size_t(33), kLarge}) {
        Bytes buf = random_buffer(t, n, rng), want(buf.size());
        for (size_t i = 0; i < n; ++i) {
          if (mccl::is_floating(t)) store_float(t, want, i, load_float(t, buf, i) / double(d));
          else store_int(t, want, i, load_int(t, buf, i) / d);  // C++ division truncates toward zero
        }
        mccl::divide_by(buf.data(), n, t, d);
        size_t bad = first_mismatch(t, buf, want, n);
        CHECK_MSG(bad == n, "%s / %lld n=%zu at %zu: got %s want %s", mccl::dtype_name(t), (long long)d, n, bad,
                  hex(t, buf, bad).c_str(), hex(t, want, bad).c_str());
      }
    }
  }
  Bytes ints = typed<int32_t>({-7, 7, -1, 1});
  mccl::divide_by(ints.data(), 4, DataType::kInt32, 2);
  CHECK(ints == typed<int32_t>({-3, 3, 0, 0}));
  Bytes fl = typed<float>({1.0f, -3.0f});
  mccl::divide_by(fl.data(), 2, DataType::kFloat32, 4);
  CHECK(fl == typed<float>({0.25f, -0.75f}));
  expect_invalid([&] { mccl::divide_by(fl.data(), 2, DataType::kBool, 2); }, {"avg", "bool"}, "divide bool");
  expect_invalid([&] { mccl::divide_by(fl.data(), 2, DataType::kFloat32, 0); }, {"divisor"}, "divide by 0");
  expect_invalid([&] { mccl::divide_by(fl.data(), 2, DataType::kFloat32, -2); }, {"divisor"}, "divide by -2");
}

TEST(op_supported_table) {
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
      bool want = t == DataType::kBool ? op != ReduceOp::kAvg : mccl::is_floating(t) ? !bitwise : true;
      CHECK_MSG(mccl::op_supported(t, op) == want, "%s %s", mccl::dtype_name(t), mccl::op_name(op));
    }
  }
  CHECK(!mccl::op_supported(DataType(0), ReduceOp::kSum));
  CHECK(!mccl::op_supported(DataType(42), ReduceOp::kSum));
  CHECK(!mccl::op_supported(DataType::kFloat32, ReduceOp(0)));
  CHECK(!mccl::op_supported(DataType::kInt32, ReduceOp(9)));
}

TEST(unsupported_pairs_throw_invalid_argument) {
  float x[4] = {}, y[4] = {};
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (mccl::op_supported(t, op)) continue;
      std::string label = std::string(mccl::dtype_name(t)) + "/" + mccl::op_name(op);
      auto names = {mccl::op_name(op), mccl::dtype_name(t)};
      expect_invalid([&] { mccl::reduce_into(x, y, 1, t, op); }, names, label.c_str());
      expect_invalid([&] { mccl::reduce_into(x, y, 0, t, op); }, names, label.c_str());
    }
  }
  const DataType f32 = DataType::kFloat32;
  const ReduceOp sum = ReduceOp::kSum;
  expect_invalid([&] { mccl::reduce_into(x, y, 1, DataType(42), sum); }, {"sum"}, "bad dtype");
  expect_invalid([&] { mccl::reduce_into(x, y, 1, f32, ReduceOp(77)); }, {"float32"}, "bad op");
  expect_invalid([&] { mccl::reduce_into(x, x + 1, 2, f32, sum); }, {"overlap"}, "partial overlap");
  expect_invalid([&] { mccl::reduce_into(nullptr, y, 1, f32, sum); }, {"null"}, "null");
  mccl::reduce_into(nullptr, nullptr, 0, f32, sum);  // empty: nothing to touch
}

TEST(concurrent_large_reductions) {
  // Several communicator threads reducing large buffers at once: one gets the pool, the rest run inline.
  const size_t n = (size_t(1) << 20) + 5;  // 4 MiB + 20 bytes of float32: above the threaded threshold
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      std::vector<float> a(n), b(n);
      for (size_t i = 0; i < n; ++i) a[i] = float(i % 1000) + k, b[i] = float(i % 7);
      bool good = true;
      for (int rep = 0; rep < 5; ++rep) {
        std::vector<float> d = a;
        mccl::reduce_into(d.data(), b.data(), n, DataType::kFloat32, ReduceOp::kSum);
        for (size_t i = 0; i < n; ++i) good = good && d[i] == a[i] + b[i];
      }
      ok[k] = good;
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) CHECK_MSG(ok[k], "thread %d", k);
}

// A part that throws, the caller's (part 0) or a worker's: the call rethrows it only once every part has
// finished (the workers run on the caller's frame), and the pool splits the next call as before.
TEST(a_throwing_part_reaches_the_caller_after_every_part) {
  if (mccl::pool_width() < 2) return;  // no worker on this host: nothing runs beside the caller
  const size_t count = size_t(1) << 16;
  for (bool worker_throws : {false, true}) {
    std::atomic<int> finished{0};
    std::string caught;
    try {
      mccl::try_run_parts(count, 64, 2, [&](size_t begin, size_t) {
        if ((begin != 0) == worker_throws) throw std::runtime_error("part failed");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        ++finished;
      });
    } catch (const std::runtime_error& e) {
      caught = e.what();
    }
    CHECK_MSG(caught == "part failed" && finished == 1, "worker_throws %d: '%s', %d finished", worker_throws,
              caught.c_str(), finished.load());
  }
  std::atomic<size_t> covered{0};
  CHECK(mccl::try_run_parts(count, 64, 2, [&](size_t, size_t n) { covered += n; }));
  CHECK(covered == count);
}

MCCL_TEST_MAIN
