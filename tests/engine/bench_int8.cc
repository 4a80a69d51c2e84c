// The 8-bit allreduce measured on loopback threads (docs/int8.md): its two algorithms (MCCL_INT8_ALGO: the
// reduce-once exchange, and the ring whose partial sums are requantised at every hop) against a float64
// reference, on float32 values (a CPU tensor's: the engine encodes and decodes) and on values encoded by the
// caller (an accelerator tensor's, whose device encodes and decodes: the engine's share of its work), with bf16 on
// the wire (the plain ring) as the yardstick.
// Prints one row per design and world size:
// relative error (2-norm, and the largest error over the largest magnitude), that error after 20 steps of
// error feedback (the mean of the results against the exact mean), and the process's CPU time per element
// and rank (the least of 5 runs; loopback TCP's copies included). Also the codec's own cost per element on
// one thread.
//
//   build/engine/bench_int8 [count] [worlds...]        (default: 1048576 values, worlds 8 and 24)
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "codec.h"
#include "inputs.h"
#include "int8_blocks.h"
#include "local_world.h"

using namespace mccl;

namespace {

double cpu_seconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Gradient-like: a shared signal whose magnitude varies over 2^12 from block to block, plus each rank's own
// part of the same size (ranks see different data).
float gradient(int rank, size_t i) {
  const float scale = std::ldexp(1.0f, static_cast<int>((i / 4096) % 13) - 6);
  return scale * (mccl_test::input(1000, i) + mccl_test::input(rank, i));
}

enum class Path { kFloat32, kEncoded, kBf16Ring };

struct Design {
  const char* name;
  Path path;
  AlgoChoice int8_algo = AlgoChoice::kExchange;
};

struct Row {
  double rel_l2 = 0, rel_max = 0, rel_l2_feedback = 0, cpu_ns = 0;
};

// The caller's part of the encoded path, with the engine's conversions: residual added, encoded, the residual
// left holding the error (what the device does in torch ops, csrc/torch/int8_codec.cpp).
void encode_with_feedback(std::vector<char>& blocks, const std::vector<float>& in, float* residual) {
  const size_t count = in.size();
  std::vector<float> y(in), back(count);
  if (residual)
    for (size_t i = 0; i < count; ++i) y[i] += residual[i];
  int8_encode(blocks.data(), y.data(), count);
  if (!residual) return;
  int8_decode(back.data(), blocks.data(), count);
  for (size_t i = 0; i < count; ++i) residual[i] = std::isfinite(y[i]) ? y[i] - back[i] : 0.0f;
}

Row measure(const Design& d, int world, size_t count) {
  Config config;
  config.int8_algo = d.int8_algo;
  if (d.path == Path::kBf16Ring) config.algo = AlgoChoice::kRing, config.wire_dtype = DataType::kBFloat16;
  std::vector<std::vector<float>> results(world), means(world);
  double cpu = 0;
  const int steps = 20;
  std::mutex mu;
  auto errors = mccl_test::run_world(world, [&](int rank, Communicator& comm) {
    std::vector<float> in(count), buf(count), residual(count, 0.0f), sum(count, 0.0f);
    std::vector<char> blocks(int8_wire_bytes(count));
    for (size_t i = 0; i < count; ++i) in[i] = gradient(rank, i);
    const ValueRange own = int8_segment(count, rank, world);
    // The caller's conversions (the encoded path's) run outside the timed collective.
    auto prepare = [&](float* res) {
      if (d.path == Path::kEncoded) encode_with_feedback(blocks, in, res);
      else buf = in;
    };
    auto run = [&](float* res) {
      switch (d.path) {
        case Path::kFloat32: comm.allreduce_int8(buf.data(), count, ReduceOp::kSum, res)->wait(); break;
        case Path::kEncoded:
          comm.allreduce_int8_blocks(blocks.data(), count, ReduceOp::kSum, res ? res + own.first : nullptr)->wait();
          break;
        case Path::kBf16Ring: comm.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum)->wait(); break;
      }
    };
    auto result = [&] {
      if (d.path == Path::kEncoded) int8_decode(buf.data(), blocks.data(), count);
    };
    prepare(nullptr), run(nullptr);  // warm-up: connections, buffers
    for (int k = 0; k < 5; ++k) {  // the least CPU time of 5 (the machine is shared)
      prepare(nullptr);
      comm.barrier()->wait();
      const double t0 = rank == 0 ? cpu_seconds() : 0;
      run(nullptr);
      comm.barrier()->wait();
      if (rank == 0) cpu = k == 0 ? cpu_seconds() - t0 : std::min(cpu, cpu_seconds() - t0);
    }
    result();
    std::vector<float> once = buf;
    const bool feedback = d.path != Path::kBf16Ring;
    for (int s = 0; s < steps; ++s) {
      prepare(feedback ? residual.data() : nullptr);
      run(feedback ? residual.data() : nullptr);
      result();
      for (size_t i = 0; i < count; ++i) sum[i] += buf[i];
    }
    std::lock_guard<std::mutex> lock(mu);
    results[rank] = once;
    means[rank] = sum;
  }, std::chrono::seconds(600), config);
  for (int r = 0; r < world; ++r)
    if (!errors[r].empty()) std::fprintf(stderr, "rank %d: %s\n", r, errors[r].c_str());
  Row row;
  double err2 = 0, ref2 = 0, err_max = 0, ref_max = 0, mean_err2 = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < world; ++r) exact += gradient(r, i);
    const double e = results[0][i] - exact;
    err2 += e * e;
    ref2 += exact * exact;
    err_max = std::max(err_max, std::fabs(e));
    ref_max = std::max(ref_max, std::fabs(exact));
    const double m = means[0][i] / steps - exact;
    mean_err2 += m * m;
  }
  row.rel_l2 = std::sqrt(err2 / ref2);
  row.rel_max = err_max / ref_max;
  row.rel_l2_feedback = std::sqrt(mean_err2 / ref2);
  row.cpu_ns = cpu * 1e9 / (static_cast<double>(count) * world);
  return row;
}

// One thread's cost per value of the codec's two passes: encoding a rank's own values, and folding a
// received piece into a partial sum that is encoded onward (the ring's hop, the exchange's last fold).
void codec_cost(size_t count) {
  for (WireType type : {WireType::kBFloat16, WireType::kInt8Blocks}) {
    auto codec = Codec::make(type, DataType::kFloat32, ReduceOp::kSum, 8, 1);
    std::vector<float> x(count), acc(count);
    for (size_t i = 0; i < count; ++i) x[i] = acc[i] = gradient(0, i);
    std::vector<char> wire(codec->wire_bytes(count)), onward(codec->wire_bytes(count));
    codec->encode(wire.data(), x.data(), count);
    auto time = [&](auto&& body) {
      double best = 1e30;
      for (int k = 0; k < 5; ++k) {
        auto t0 = std::chrono::steady_clock::now();
        body();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return best * 1e9 / count;
    };
    const double encode = time([&] { codec->encode(wire.data(), x.data(), count); });
    const double decode = time([&] { codec->decode(acc.data(), wire.data(), count); });
    const double fold = time([&] { codec->reduce(acc.data(), wire.data(), count, Fold{onward.data(), nullptr, false}); });
    std::printf("codec %-12s encode %.2f ns/value, decode %.2f, decode+add+encode %.2f (one thread, %zu values)\n",
                wire_format_name(type), encode, decode, fold, count);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t(1) << 20;
  std::vector<int> worlds;
  for (int k = 2; k < argc; ++k) worlds.push_back(std::atoi(argv[k]));
  if (worlds.empty()) worlds = {8, 24};
  codec_cost(count);
  const Design designs[] = {{"int8 reduce-once, float32 in and out", Path::kFloat32},
                            {"int8 reduce-once, encoded in and out", Path::kEncoded},
                            {"int8 ring, float32 in and out", Path::kFloat32, AlgoChoice::kRing},
                            {"int8 ring, encoded in and out", Path::kEncoded, AlgoChoice::kRing},
                            {"bf16 ring", Path::kBf16Ring}};
  std::printf("| design | ranks | rel. error (2-norm) | max error / max | after 20 steps with feedback | CPU ns/value/rank |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int world : worlds) {
    for (const Design& d : designs) {
      const Row row = measure(d, world, count);
      std::printf("| %s | %d | %.2e | %.2e | %.2e | %.1f |\n", d.name, world, row.rel_l2, row.rel_max,
                  row.rel_l2_feedback, row.cpu_ns);
      std::fflush(stdout);
    }
  }
}
