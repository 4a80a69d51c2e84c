// Wire compression (MCCL_WIRE_DTYPE=bf16/fp16): results against a float64 reference within the documented
// bound, every rank holding the same bits, the conversion kernels against a scalar reference, and a rank
// that compresses while its peer does not failing with an error that names the setting.
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "check.h"
#include "collective.h"
#include "inputs.h"
#include "local_world.h"
#include "reduce.h"
#include "reduce_pool.h"

using namespace mccl;
using mccl_test::input;
using mccl_test::Results;
using mccl_test::run_world;

namespace {

// The unit roundoff of the wire type: relative error of one rounding to nearest.
double unit_roundoff(DataType wire) { return wire == DataType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

Config compressed(DataType wire, AlgoChoice algo, size_t chunk_bytes = 64) {
  Config c;
  c.wire_dtype = wire;
  c.algo = algo;
  c.chunk_bytes = chunk_bytes;  // 64: several pieces per ring segment
  return c;
}

}  // namespace

TEST(conversion_kernels_match_scalar_rounding) {
  // bf16: round to nearest even on the top 16 bits; fp16 of values exact in half must round-trip.
  std::vector<float> src = {1.0f, -2.5f, 3.14159265f, 1.00390625f /* tie: 1 + 2^-8 */, 1.01171875f /* tie, odd */,
                            65504.0f, 1e-3f, 0.0f, -0.0f};
  std::vector<uint16_t> wire(src.size());
  std::vector<float> back(src.size());
  narrow_float32(wire.data(), src.data(), src.size(), DataType::kBFloat16);
  widen_to_float32(back.data(), wire.data(), src.size(), DataType::kBFloat16);
  CHECK(back[0] == 1.0f && back[1] == -2.5f);
  CHECK(back[2] == 3.140625f);     // 3.14159 -> nearest bf16
  CHECK(back[3] == 1.0f);          // tie rounds to even (mantissa ...0)
  CHECK(back[4] == 1.015625f);     // tie rounds to even (up)
  CHECK(std::signbit(back[8]) && back[8] == 0.0f);
  std::vector<float> rounded = src;
  round_float32_through(rounded.data(), rounded.size(), DataType::kBFloat16);
  CHECK(std::memcmp(rounded.data(), back.data(), back.size() * sizeof(float)) == 0);
  narrow_float32(wire.data(), src.data(), src.size(), DataType::kFloat16);
  widen_to_float32(back.data(), wire.data(), src.size(), DataType::kFloat16);
  CHECK(back[0] == 1.0f && back[1] == -2.5f && back[5] == 65504.0f);
  CHECK(std::fabs(back[6] - 1e-3f) <= 1e-3f * unit_roundoff(DataType::kFloat16));
  float big = 1e6f;
  uint16_t h;
  narrow_float32(&h, &big, 1, DataType::kFloat16);
  widen_to_float32(&back[0], &h, 1, DataType::kFloat16);
  CHECK(std::isinf(back[0]));  // beyond half's range: documented overflow to Inf
}

TEST(compressed_allreduce_is_bounded_and_identical_on_every_rank) {
  // Small counts in 64-byte pieces (several per ring segment); 40000 floats through the ring in 16 KiB pieces
  // (8192 compressed floats, longer than the widening tile). One world per piece size runs all its counts,
  // each as SUM and as AVG (which the ring divides inside its last reduce-scatter step).
  struct Batch {
    size_t chunk_bytes;
    std::vector<size_t> counts;
    bool ring_only;
  };
  const Batch batches[] = {{64, {1, 7, 1000}, false}, {16384, {40000}, true}};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg};
  for (DataType wire : {DataType::kBFloat16, DataType::kFloat16}) {
    for (AlgoChoice algo : {AlgoChoice::kRing, AlgoChoice::kRecursiveDoubling}) {
      for (int world : {2, 3, 4, 5}) {
        for (const Batch& batch : batches) {
          if (batch.ring_only && algo != AlgoChoice::kRing) continue;
          const size_t calls = batch.counts.size() * 2;  // call k: count k / 2, ops[k % 2]
          std::vector<Results> results(calls);
          for (Results& r : results) r.of_rank.resize(world);
          auto errors = run_world(world, [&](int rank, Communicator& comm) {
            for (size_t k = 0; k < calls; ++k) {
              const size_t count = batch.counts[k / 2];
              std::vector<float> buf(count);
              for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i);
              comm.allreduce(buf.data(), count, DataType::kFloat32, ops[k % 2])->wait();
              std::lock_guard<std::mutex> lock(results[k].mu);
              results[k].of_rank[rank] = buf;
            }
          }, std::chrono::seconds(30), compressed(wire, algo, batch.chunk_bytes));
          for (int r = 0; r < world; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
          if (!errors[0].empty()) continue;
          for (size_t k = 0; k < calls; ++k) {
            const size_t count = batch.counts[k / 2];
            const bool avg = ops[k % 2] == ReduceOp::kAvg;
            const auto& of_rank = results[k].of_rank;
            // Each partial sum is rounded at most once per hop (n-1 in the reduce-scatter or log2 steps, plus
            // the inputs and the final rounding): error <= (n+1) u sum|x_i| to first order. AVG divides that
            // sum by n (the ring before its final rounding): (n+1) u sum|x_i| / n, plus one rounding of it.
            const double u = unit_roundoff(wire);
            for (size_t i = 0; i < count; ++i) {
              double exact = 0, magnitude = 0;
              for (int r = 0; r < world; ++r) exact += input(r, i), magnitude += std::fabs(input(r, i));
              if (avg) exact /= world, magnitude /= world;
              float got = of_rank[0][i], as_wire = got;
              round_float32_through(&as_wire, 1, wire);
              // (recursive doubling divides each rank's rounded sum at the end, off the wire's grid)
              CHECK_MSG(avg || got == as_wire, "%s world %d: result %g is not a %s value: the wire was not compressed",
                        dtype_name(wire), world, got, dtype_name(wire));
              double err = std::fabs(got - exact);
              CHECK_MSG(err <= (world + (avg ? 2 : 1)) * u * magnitude * 1.01,
                        "%s %s world %d count %zu i %zu: got %g want %g", dtype_name(wire), avg ? "avg" : "sum",
                        world, count, i, of_rank[0][i], exact);
            }
            for (int r = 1; r < world; ++r)
              CHECK_MSG(std::memcmp(of_rank[r].data(), of_rank[0].data(), count * sizeof(float)) == 0,
                        "%s %s world %d count %zu: rank %d differs from rank 0", dtype_name(wire),
                        avg ? "avg" : "sum", world, count, r);
          }
        }
      }
    }
  }
}

// Only reductions are compressed: broadcast and allgather move data that must arrive exact (DDP's broadcast
// of the initial weights), so they give every rank the senders' float32 bits.
TEST(broadcast_and_allgather_stay_exact_under_compression) {
  const int world = 3;
  const size_t count = 300;
  Results gathered, broadcast;
  gathered.of_rank.resize(world);
  broadcast.of_rank.resize(world);
  auto errors = run_world(world, [&](int rank, Communicator& comm) {
    std::vector<float> in(count), all(count * world), b(count);
    for (size_t i = 0; i < count; ++i) in[i] = input(rank, i), b[i] = input(1, i);
    std::vector<char*> outs;
    for (int k = 0; k < world; ++k) outs.push_back(reinterpret_cast<char*>(all.data() + k * count));
    comm.allgather(in.data(), count, DataType::kFloat32, outs)->wait();
    comm.broadcast(b.data(), count, DataType::kFloat32, 1)->wait();
    std::lock_guard<std::mutex> lock(gathered.mu);
    gathered.of_rank[rank] = all;
    broadcast.of_rank[rank] = b;
  }, std::chrono::seconds(30), compressed(DataType::kBFloat16, AlgoChoice::kAuto));
  for (int r = 0; r < world; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
  if (!errors[0].empty()) return;
  for (int r = 0; r < world; ++r) {
    for (int k = 0; k < world; ++k)
      for (size_t i = 0; i < count; ++i)
        CHECK_MSG(gathered.of_rank[r][k * count + i] == input(k, i), "allgather rank %d slot %d i %zu", r, k, i);
    for (size_t i = 0; i < count; ++i) CHECK_MSG(broadcast.of_rank[r][i] == input(1, i), "broadcast rank %d i %zu", r, i);
  }
}

// The conversions and the compressed pieces' reduction split over the pool (MCCL_REDUCE_THREADS): element by
// element the same work, so the same bits as one thread, on odd lengths that end mid-tile and mid-part.
TEST(conversions_split_over_threads_equal_one_thread) {
  const size_t count = 3 * kSplitConversionsFrom + 4099;
  std::vector<float> src(count);
  for (size_t i = 0; i < count; ++i) src[i] = input(7, i) * (i % 97 == 0 ? 1e30f : 1.0f);  // fp16 overflows too
  for (DataType wire : {DataType::kBFloat16, DataType::kFloat16}) {
    std::vector<uint16_t> one(count), split(count);
    narrow_float32(one.data(), src.data(), count, wire, 1);
    narrow_float32(split.data(), src.data(), count, wire, 0);
    CHECK_MSG(one == split, "%s: narrow differs when split over %zu threads", dtype_name(wire), pool_width());
    std::vector<float> wide_one(count), wide_split(count);
    widen_to_float32(wide_one.data(), one.data(), count, wire, 1);
    widen_to_float32(wide_split.data(), one.data(), count, wire, 0);
    CHECK(std::memcmp(wide_one.data(), wide_split.data(), count * sizeof(float)) == 0);
    std::vector<float> round_one = src, round_split = src;
    round_float32_through(round_one.data(), count, wire, 1);
    round_float32_through(round_split.data(), count, wire, 0);
    CHECK(std::memcmp(round_one.data(), round_split.data(), count * sizeof(float)) == 0);
    CHECK(std::memcmp(round_one.data(), wide_one.data(), count * sizeof(float)) == 0);
  }
}

TEST(compressed_ring_over_reduce_threads_equals_one_thread) {
  // MCCL_CHUNK_BYTES' default: compressed pieces of 256K floats, over the split threshold; the count leaves a
  // short last piece. Every rank and both settings must hold the same bits.
  const int world = 3;
  const size_t count = mccl_test::sized(6 * kSplitConversionsFrom + 11, 3 * kSplitConversionsFrom + 11);
  std::vector<std::vector<float>> by_threads;
  for (size_t threads : {size_t(1), size_t(4)}) {
    Results results;
    results.of_rank.resize(world);
    Config config = compressed(DataType::kBFloat16, AlgoChoice::kRing, Config{}.chunk_bytes);
    config.reduce_threads = threads;
    auto errors = run_world(world, [&](int rank, Communicator& comm) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = input(rank, i);
      comm.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum)->wait();
      std::lock_guard<std::mutex> lock(results.mu);
      results.of_rank[rank] = buf;
    }, std::chrono::seconds(60), config);
    for (int r = 0; r < world; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
    if (!errors[0].empty()) return;
    for (int r = 1; r < world; ++r)
      CHECK_MSG(results.of_rank[r] == results.of_rank[0], "%zu threads: rank %d differs from rank 0", threads, r);
    by_threads.push_back(results.of_rank[0]);
  }
  CHECK_MSG(std::memcmp(by_threads[0].data(), by_threads[1].data(), count * sizeof(float)) == 0,
            "4 reduce threads give other bits than 1");
  for (size_t i = 0; i < count; i += 4099) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < world; ++r) exact += input(r, i), magnitude += std::fabs(input(r, i));
    CHECK_MSG(std::fabs(by_threads[0][i] - exact) <= (world + 1) * unit_roundoff(DataType::kBFloat16) * magnitude * 1.01,
              "i %zu: got %g want %g", i, by_threads[0][i], exact);
  }
}

// A wire buffer is in use from take() on: one taken but not yet held by a request (an onward encoding before
// its send) is not handed out again; one whose request is done is.
TEST(a_wire_buffer_is_in_use_from_take_until_its_request_is_done) {
  WireBuffers buffers;
  char* taken = buffers.take(64);
  CHECK(buffers.take(64) != taken);
  buffers.release_all();
  char* posted = buffers.take(64);
  auto request = std::make_shared<Request>();
  buffers.hold(request);
  CHECK(buffers.take(64) != posted);
  request->done = true;
  buffers.release_all();
  posted = buffers.take(64);
  buffers.hold(request);
  CHECK(buffers.take(64) == posted);
}

TEST(one_rank_compressing_alone_is_a_named_mismatch) {
  mccl_test::MemoryStore store(std::chrono::seconds(10));
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      Config config;
      if (rank == 1) config.wire_dtype = DataType::kBFloat16;
      try {
        Communicator comm(store, rank, 2, std::chrono::seconds(10), "127.0.0.1", config);
        std::vector<float> buf(64, 1.0f);
        comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
      } catch (const Error& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    CHECK_MSG(errors[rank].find("MCCL_WIRE_DTYPE") != std::string::npos, "rank %d: '%s'", rank, errors[rank].c_str());
  }
}

MCCL_TEST_MAIN
