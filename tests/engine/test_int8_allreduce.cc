// The 8-bit allreduce (Communicator::allreduce_int8, docs/int8.md): the exchange's results against a float64
// reference within its bound on several world sizes, uneven and not a multiple of the block, every rank holding
// the same bits; its error feedback, whose residuals are each rank's real quantisation error, so that their sum,
// and the error of the results summed over many steps, stay bounded; on both algorithms (the exchange and the
// ring: test_int8_ring.cc has the ring's bound), NaN and Inf that come out as themselves and do not stick in the
// residual, and the entry for values encoded already (a device's) equal to the float32 one, bit for bit, in
// results and residuals, also when ranks mix them; bad input and a rank that calls the plain allreduce meanwhile
// named.
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "check.h"
#include "inputs.h"
#include "int8_blocks.h"
#include "local_world.h"

using namespace mccl;
using mccl_test::input;
using mccl_test::Results;
using mccl_test::run_world;

namespace {

constexpr double kInputMax = 4.0;  // |input| < 4

// Each rank's contribution is encoded once (error <= its block's largest magnitude / 252, times 1 + 2^-16), and
// so is the sum, at its owner: at most 2 n 4 / 252 over n ranks, plus float32's rounding of the sum.
double bound(int world) {
  return (2.0 * world * kInputMax / 252.0) * (1 + std::ldexp(1.0, -16)) + world * kInputMax * std::ldexp(1.0, -22);
}

Config with_chunk(size_t chunk_bytes, AlgoChoice algo = AlgoChoice::kAuto) {
  Config c;
  c.chunk_bytes = chunk_bytes;
  c.int8_algo = algo;
  return c;
}

// The 8-bit allreduce's two algorithms (MCCL_INT8_ALGO): what holds for both is checked on both.
constexpr AlgoChoice kBothAlgorithms[] = {AlgoChoice::kExchange, AlgoChoice::kRing};
const char* name_of(AlgoChoice algo) { return algo == AlgoChoice::kRing ? "ring" : "exchange"; }

}  // namespace

TEST(int8_allreduce_is_within_its_bound_and_identical_on_every_rank) {
  // 4096 bytes on the wire: pieces of 15 blocks, so most segments have several, and short last blocks.
  const size_t counts[] = {1, 2, 255, 257, 1000, mccl_test::sized(40007, 9007)};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg};
  for (int world : {1, 2, 3, 5, 8}) {
    const size_t calls = std::size(counts) * 2;
    std::vector<Results> results(calls);
    for (Results& r : results) r.of_rank.resize(world);
    auto errors = run_world(world, [&](int rank, Communicator& comm) {
      for (size_t k = 0; k < calls; ++k) {
        const size_t count = counts[k / 2];
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i);
        comm.allreduce_int8(buf.data(), count, ops[k % 2], nullptr)->wait();
        std::lock_guard<std::mutex> lock(results[k].mu);
        results[k].of_rank[rank] = buf;
      }
    }, std::chrono::seconds(60), with_chunk(4096, AlgoChoice::kExchange));
    for (int r = 0; r < world; ++r) CHECK_MSG(errors[r].empty(), "world %d rank %d: %s", world, r, errors[r].c_str());
    if (!errors[0].empty()) continue;
    for (size_t k = 0; k < calls; ++k) {
      const size_t count = counts[k / 2];
      const bool avg = ops[k % 2] == ReduceOp::kAvg;
      const auto& of_rank = results[k].of_rank;
      double largest = 0;
      for (size_t i = 0; i < count; ++i) {
        double exact = 0;
        for (int r = 0; r < world; ++r) exact += input(r, i);
        const double err = std::fabs(of_rank[0][i] - (avg ? exact / world : exact));
        largest = std::max(largest, err);
        CHECK_MSG(err <= bound(world) / (avg ? world : 1), "world %d %s count %zu i %zu: got %g want %g", world,
                  avg ? "avg" : "sum", count, i, of_rank[0][i], avg ? exact / world : exact);
      }
      // 8 bits really travelled: far more error than float32's, but one rank alone reduces nothing.
      if (world > 1 && count > 100) CHECK_MSG(largest > 1e-4, "world %d count %zu: looks exact", world, count);
      if (world == 1) CHECK(largest == 0);
      for (int r = 1; r < world; ++r)
        CHECK_MSG(std::memcmp(of_rank[r].data(), of_rank[0].data(), count * sizeof(float)) == 0,
                  "world %d count %zu: rank %d differs from rank 0", world, count, r);
    }
  }
}

// The same inputs every step, so that without feedback the same rounding errors add up step after step. With
// it, what the ranks keep back is exactly what the results lack: sum over steps of the results plus the sum
// of the residuals equals the sum of the inputs (to float32's rounding), and the residuals stay within one
// step's error.
TEST(error_feedback_keeps_the_residual_sum_bounded) {
  const int world = 3, steps = 60;
  const size_t count = 3000;
  for (bool feedback : {true, false}) {
    std::vector<double> total(count, 0.0);  // rank 0's results summed over the steps
    std::vector<std::vector<float>> residuals(world);
    std::vector<double> worst_residual_sum(steps, 0.0);
    std::mutex mu;
    auto errors = run_world(world, [&](int rank, Communicator& comm) {
      std::vector<float> residual(count, 0.0f), buf(count);
      for (int s = 0; s < steps; ++s) {
        for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i) * 0.01f;
        comm.allreduce_int8(buf.data(), count, ReduceOp::kSum, feedback ? residual.data() : nullptr)->wait();
        if (rank == 0)
          for (size_t i = 0; i < count; ++i) total[i] += buf[i];
        {
          std::lock_guard<std::mutex> lock(mu);
          residuals[rank] = residual;
        }
        comm.barrier()->wait();  // every rank's residual of this step is in
        if (rank == 0) {
          for (size_t i = 0; i < count; ++i) {
            double sum = 0;
            for (int r = 0; r < world; ++r) sum += residuals[r][i];
            worst_residual_sum[s] = std::max(worst_residual_sum[s], std::fabs(sum));
          }
        }
        comm.barrier()->wait();
      }
    }, std::chrono::seconds(60), with_chunk(Config().chunk_bytes, AlgoChoice::kExchange));
    for (int r = 0; r < world; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
    if (!errors[0].empty()) return;
    const double step_bound = bound(world) * 0.01;
    double drift = 0;
    for (size_t i = 0; i < count; ++i) {
      double exact = 0, kept = 0;
      for (int r = 0; r < world; ++r) exact += input(r, i) * 0.01f, kept += residuals[r][i];
      const double missing = steps * exact - total[i];
      drift = std::max(drift, std::fabs(missing));
      if (feedback)
        CHECK_MSG(std::fabs(missing - kept) <= steps * world * 0.04 * std::ldexp(1.0, -22) + 1e-9,
                  "i %zu: the results lack %g, the residuals hold %g", i, missing, kept);
    }
    if (feedback) {
      for (int s = 0; s < steps; ++s)
        CHECK_MSG(worst_residual_sum[s] <= step_bound, "step %d: residual sum %g above %g", s, worst_residual_sum[s],
                  step_bound);
      CHECK_MSG(drift <= step_bound, "with feedback the summed results drift by %g (bound %g)", drift, step_bound);
    } else {
      CHECK_MSG(drift > 4 * step_bound, "without feedback the drift %g should grow past %g", drift, 4 * step_bound);
    }
  }
}

static void nan_and_inf_on(AlgoChoice algo) {
  const int world = 3;
  const size_t count = 2000;
  const float inf = std::numeric_limits<float>::infinity();
  Results first, second;
  first.of_rank.resize(world);
  second.of_rank.resize(world);
  std::vector<std::vector<float>> residuals(world);
  auto errors = run_world(world, [&](int rank, Communicator& comm) {
    std::vector<float> residual(count, 0.0f), buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i);
    if (rank == 0) buf[10] = std::numeric_limits<float>::quiet_NaN();
    if (rank == 1) buf[700] = inf;
    if (rank == 2) buf[1500] = -inf;
    if (rank != 0) buf[1999] = inf;  // two ranks: still +Inf
    if (rank > 0) buf[1200] = rank == 1 ? inf : -inf;  // +Inf and -Inf: NaN
    comm.allreduce_int8(buf.data(), count, ReduceOp::kAvg, residual.data())->wait();
    std::vector<float> once = buf;
    for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i);
    comm.allreduce_int8(buf.data(), count, ReduceOp::kAvg, residual.data())->wait();
    std::lock_guard<std::mutex> lock(first.mu);
    first.of_rank[rank] = once;
    second.of_rank[rank] = buf;
    residuals[rank] = residual;
  }, std::chrono::seconds(30), with_chunk(4096, algo));
  for (int r = 0; r < world; ++r) CHECK_MSG(errors[r].empty(), "%s rank %d: %s", name_of(algo), r, errors[r].c_str());
  if (!errors[0].empty()) return;
  for (int r = 0; r < world; ++r) {
    const std::vector<float>& got = first.of_rank[r];
    CHECK_MSG(std::isnan(got[10]), "%s rank %d: NaN came out as %g", name_of(algo), r, got[10]);
    CHECK_MSG(got[700] == inf && got[1999] == inf, "rank %d: +Inf came out as %g, %g", r, got[700], got[1999]);
    CHECK_MSG(got[1500] == -inf, "rank %d: -Inf came out as %g", r, got[1500]);
    CHECK_MSG(std::isnan(got[1200]), "rank %d: +Inf - Inf came out as %g", r, got[1200]);
    // Within the exchange's bound twice over (the ring's one hop at 3 ranks adds less than that).
    for (size_t i = 0; i < count; ++i) {
      if (i == 10 || i == 700 || i == 1200 || i == 1500 || i == 1999) continue;
      double exact = 0;
      for (int k = 0; k < world; ++k) exact += input(k, i);
      CHECK_MSG(std::fabs(got[i] - exact / world) <= 2 * bound(world) / world, "rank %d i %zu: %g, want %g", r, i,
                got[i], exact / world);
    }
    for (size_t i = 0; i < count; ++i) {
      CHECK_MSG(std::isfinite(second.of_rank[r][i]), "rank %d i %zu: %g in the next call", r, i, second.of_rank[r][i]);
      CHECK_MSG(std::isfinite(residuals[r][i]), "rank %d i %zu: residual %g", r, i, residuals[r][i]);
    }
  }
}

TEST(nan_and_inf_come_out_as_themselves_and_do_not_stick_in_the_residual) {
  for (AlgoChoice algo : kBothAlgorithms) nan_and_inf_on(algo);
}

// What the torch binding does on a device (csrc/torch/int8_codec.cpp), with the engine's conversions: the values
// plus their residual encoded, the residual left holding that encoding's error, the encoded collective (the
// residual's owned part given to it), the result decoded.
static void allreduce_encoded(Communicator& comm, float* buf, size_t count, ReduceOp op, float* residual) {
  std::vector<float> y(count), back(count);
  for (size_t i = 0; i < count; ++i) y[i] = buf[i] + residual[i];
  std::vector<char> blocks(int8_wire_bytes(count));
  int8_encode(blocks.data(), y.data(), count, 1);
  int8_decode(back.data(), blocks.data(), count, 1);
  for (size_t i = 0; i < count; ++i) residual[i] = std::isfinite(y[i]) ? y[i] - back[i] : 0.0f;
  const ValueRange own = int8_segment(count, comm.rank(), comm.size());
  comm.allreduce_int8_blocks(blocks.data(), count, op, residual + own.first)->wait();
  int8_decode(buf, blocks.data(), count, 1);
}

static void entries_agree_on(AlgoChoice algo) {
  const int world = 3, steps = 3;
  const size_t count = mccl_test::sized(40007, 9007);
  // Which ranks encode their values themselves: none, all, rank 1 only.
  const std::vector<std::vector<bool>> modes = {{false, false, false}, {true, true, true}, {false, true, false}};
  std::vector<Results> results(modes.size()), residuals(modes.size());
  for (size_t m = 0; m < modes.size(); ++m) {
    results[m].of_rank.resize(world), residuals[m].of_rank.resize(world);
    auto errors = run_world(world, [&](int rank, Communicator& comm) {
      std::vector<float> buf(count), residual(count, 0.0f);
      for (int s = 0; s < steps; ++s) {
        for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i) * (s + 1);
        if (rank == 2) buf[77] = std::numeric_limits<float>::infinity();
        const ReduceOp op = s % 2 ? ReduceOp::kSum : ReduceOp::kAvg;
        if (modes[m][rank]) allreduce_encoded(comm, buf.data(), count, op, residual.data());
        else comm.allreduce_int8(buf.data(), count, op, residual.data())->wait();
      }
      std::lock_guard<std::mutex> lock(results[m].mu);
      results[m].of_rank[rank] = buf;
      residuals[m].of_rank[rank] = residual;
    }, std::chrono::seconds(60), with_chunk(4096, algo));
    for (int r = 0; r < world; ++r)
      CHECK_MSG(errors[r].empty(), "%s mode %zu rank %d: %s", name_of(algo), m, r, errors[r].c_str());
  }
  for (size_t m = 0; m < modes.size(); ++m) {
    for (int r = 0; r < world; ++r) {
      CHECK_MSG(std::memcmp(results[m].of_rank[r].data(), results[0].of_rank[0].data(), count * sizeof(float)) == 0,
                "%s mode %zu rank %d: the results differ from the float32 entry's", name_of(algo), m, r);
      CHECK_MSG(std::memcmp(residuals[m].of_rank[r].data(), residuals[0].of_rank[r].data(), count * sizeof(float)) == 0,
                "%s mode %zu rank %d: the residuals differ from the float32 entry's", name_of(algo), m,
                r);
    }
  }
  CHECK(results[0].of_rank[0][77] == std::numeric_limits<float>::infinity());
}

TEST(encoded_values_give_the_same_bits_as_float32_ones_and_ranks_may_mix_them) {
  for (AlgoChoice algo : kBothAlgorithms) entries_agree_on(algo);
}

TEST(an_op_that_does_not_sum_is_an_error_naming_it) {
  auto errors = run_world(2, [&](int, Communicator& comm) {
    std::vector<float> buf(16, 1.0f);
    try {
      comm.allreduce_int8(buf.data(), buf.size(), ReduceOp::kMax, nullptr);
      CHECK_MSG(false, "MAX was accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == Error::Kind::kInvalidArgument);
      CHECK_MSG(std::string(e.what()).find("does not support reduce op max") != std::string::npos, "'%s'", e.what());
    }
  });
  for (int r = 0; r < 2; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
}

TEST(a_rank_that_calls_the_plain_allreduce_is_a_named_mismatch) {
  auto errors = run_world(2, [&](int rank, Communicator& comm) {
    std::vector<float> buf(4096, 1.0f);
    if (rank == 0) comm.allreduce_int8(buf.data(), buf.size(), ReduceOp::kSum, nullptr)->wait();
    else comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
  }, std::chrono::seconds(10));
  for (int r = 0; r < 2; ++r)
    CHECK_MSG(errors[r].find("8-bit allreduce") != std::string::npos, "rank %d: '%s'", r, errors[r].c_str());
}

MCCL_TEST_MAIN
