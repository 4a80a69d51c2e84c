// Every collective, on 1..9 ranks (threads), against a reference computed independently in double.
// MCCL_CHUNK_BYTES-equivalent config shrinks pieces so multi-piece ring paths run on small data.
#include <cmath>
#include <cstring>
#include <vector>

#include "check.h"
#include "dtype.h"
#include "local_world.h"

using namespace mccl;
using mccl_test::run_world;

namespace {

// Small integers are exact in every dtype (bf16 included), so sums, mins and maxes compare exactly.
double value(int rank, size_t i, ReduceOp op) {
  if (op == ReduceOp::kProduct) return ((i + rank) % 3 == 0) ? -1.0 : 1.0;
  return static_cast<double>(static_cast<int>((rank * 31 + i * 7) % 13) - 6);
}

uint16_t to_half_bits(float f) {  // exact for the small integers used here
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  if ((x & 0x7fffffff) == 0) return static_cast<uint16_t>(sign);
  int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  return static_cast<uint16_t>(sign | (exp << 10) | ((x >> 13) & 0x3ff));
}
float from_half_bits(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0 && mant == 0) {
    float f;
    std::memcpy(&f, &sign, 4);
    return f;
  }
  uint32_t x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

void put(DataType t, void* buf, size_t i, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = v; break;
    case DataType::kInt8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v); break;
    case DataType::kUInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int>(v) & 0xff); break;
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case DataType::kBool: static_cast<uint8_t*>(buf)[i] = v != 0; break;
    case DataType::kFloat16: static_cast<uint16_t*>(buf)[i] = to_half_bits(static_cast<float>(v)); break;
    case DataType::kBFloat16: {
      float f = static_cast<float>(v);
      uint32_t x;
      std::memcpy(&x, &f, 4);
      static_cast<uint16_t*>(buf)[i] = static_cast<uint16_t>(x >> 16);
      break;
    }
  }
}

double get(DataType t, const void* buf, size_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kInt8: return static_cast<const int8_t*>(buf)[i];
    case DataType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kBool: return static_cast<const uint8_t*>(buf)[i];
    case DataType::kFloat16: return from_half_bits(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBFloat16: {
      uint32_t x = static_cast<uint32_t>(static_cast<const uint16_t*>(buf)[i]) << 16;
      float f;
      std::memcpy(&f, &x, 4);
      return f;
    }
  }
  return 0;
}

// What rank-stored value v looks like once stored in dtype t (uint8 wraps, bool is 0/1).
double stored(DataType t, double v) {
  std::vector<char> tmp(8);
  put(t, tmp.data(), 0, v);
  return get(t, tmp.data(), 0);
}

double reference(DataType t, ReduceOp op, int world, size_t i) {
  double acc = stored(t, value(0, i, op));
  for (int r = 1; r < world; ++r) {
    double v = stored(t, value(r, i, op));
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      default: break;
    }
  }
  if (t == DataType::kBool) return acc != 0 ? (op == ReduceOp::kProduct || op == ReduceOp::kMin ? 1 : 1) : 0;
  if (op == ReduceOp::kAvg) return acc / world;
  return stored(t, acc);
}

double bool_reference(ReduceOp op, int world, size_t i) {
  bool any = false, all = true;
  for (int r = 0; r < world; ++r) {
    bool v = value(r, i, op) != 0;
    any = any || v;
    all = all && v;
  }
  return (op == ReduceOp::kSum || op == ReduceOp::kMax) ? any : all;
}

Config small_chunks() {
  Config c = Config::global();
  c.chunk_bytes = 24;  // several pieces per segment even for tiny buffers
  return c;
}

// Powers of two and not, one rank beyond a power (3, 5, 9) and several (7). MCCL_TEST_QUICK (ASan, qemu)
// leaves out 4 (a power of two, as 2 and 8 are) and 9 (one beyond, as 3 and 5 are): a third fewer ranks to run.
const std::vector<int> kWorlds = mccl_test::quick() ? std::vector<int>{1, 2, 3, 5, 7, 8} : std::vector<int>{1, 2, 3, 4, 5, 7, 8, 9};
std::vector<size_t> counts_for(int world) { return {0, 1, size_t(world) - 1 + 1, size_t(world) + 1, 97, 1031}; }

struct Case {
  DataType dtype;
  ReduceOp op;
};
const std::vector<Case> kReductions = {
    {DataType::kFloat32, ReduceOp::kSum},  {DataType::kFloat32, ReduceOp::kMax}, {DataType::kFloat32, ReduceOp::kMin},
    {DataType::kFloat32, ReduceOp::kProduct}, {DataType::kFloat32, ReduceOp::kAvg}, {DataType::kFloat64, ReduceOp::kSum},
    {DataType::kInt64, ReduceOp::kSum},    {DataType::kInt32, ReduceOp::kMin},   {DataType::kInt8, ReduceOp::kMax},
    {DataType::kUInt8, ReduceOp::kSum},    {DataType::kBFloat16, ReduceOp::kSum}, {DataType::kFloat16, ReduceOp::kSum},
    {DataType::kBool, ReduceOp::kSum},     {DataType::kBool, ReduceOp::kMin},
};

double expected(const Case& k, int world, size_t i) {
  return k.dtype == DataType::kBool ? bool_reference(k.op, world, i) : reference(k.dtype, k.op, world, i);
}

bool close(double got, double want, DataType t) {
  double tol = (t == DataType::kBFloat16 || t == DataType::kFloat16) ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

void check_world(const std::vector<std::string>& errors, const char* what, int world) {
  for (size_t r = 0; r < errors.size(); ++r)
    CHECK_MSG(errors[r].empty(), "%s world %d rank %zu: %s", what, world, r, errors[r].c_str());
}

}  // namespace

TEST(allreduce_all_algorithms) {
  std::vector<Config> configs;
  for (AlgoChoice algo : {AlgoChoice::kRing, AlgoChoice::kRecursiveDoubling, AlgoChoice::kAuto}) {
    configs.push_back(small_chunks());
    configs.back().algo = algo;
  }
  configs.push_back(configs.front());
  configs.back().ring_lookahead_bytes = 0;  // the ring with only a double buffer of receive slots
  for (const Config& config : configs) {
    for (int world : kWorlds) {
      auto errors = run_world(world, [&](int rank, Communicator& comm) {
        for (const Case& k : kReductions) {
          for (size_t count : counts_for(world)) {
            size_t es = dtype_size(k.dtype);
            std::vector<char> buf(count * es + 1);
            for (size_t i = 0; i < count; ++i) put(k.dtype, buf.data(), i, value(rank, i, k.op));
            comm.allreduce(buf.data(), count, k.dtype, k.op)->wait();
            for (size_t i = 0; i < count; ++i) {
              double got = get(k.dtype, buf.data(), i), want = expected(k, world, i);
              if (!close(got, want, k.dtype))
                fail(Error::Kind::kInternal, dtype_name(k.dtype), " ", op_name(k.op), " count ", count, " i ", i,
                     ": got ", got, " want ", want);
            }
          }
        }
      }, std::chrono::seconds(60), config);
      check_world(errors, "allreduce", world);
    }
  }
}

TEST(broadcast_reduce_every_root) {
  Config config = small_chunks();
  for (AlgoChoice algo : {AlgoChoice::kRing, AlgoChoice::kTree}) {  // large path (ring) and small path (trees)
    config.broadcast_algo = config.reduce_algo = algo;
    for (int world : kWorlds) {
      auto errors = run_world(world, [&](int rank, Communicator& comm) {
        for (int root = 0; root < world; ++root) {
          for (size_t count : counts_for(world)) {
            std::vector<float> buf(count);
            for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(value(rank, i, ReduceOp::kSum));
            comm.broadcast(buf.data(), count, DataType::kFloat32, root)->wait();
            for (size_t i = 0; i < count; ++i)
              if (buf[i] != static_cast<float>(value(root, i, ReduceOp::kSum)))
                fail(Error::Kind::kInternal, "broadcast root ", root, " count ", count, " i ", i, " wrong");
            std::vector<int64_t> mine(count), red(count);
            for (size_t i = 0; i < count; ++i) red[i] = mine[i] = static_cast<int64_t>(value(rank, i, ReduceOp::kSum));
            comm.reduce(red.data(), count, DataType::kInt64, ReduceOp::kSum, root)->wait();
            for (size_t i = 0; i < count; ++i) {
              int64_t want = rank == root ? static_cast<int64_t>(reference(DataType::kInt64, ReduceOp::kSum, world, i))
                                          : mine[i];
              if (red[i] != want) fail(Error::Kind::kInternal, "reduce root ", root, " count ", count, " i ", i, " wrong");
            }
          }
        }
      }, std::chrono::seconds(60), config);
      check_world(errors, "broadcast/reduce", world);
    }
  }
}

// All-gather and reduce-scatter run with each of their algorithms: the ring, and the latency-optimal
// Bruck all-gather and recursive-doubling reduce-scatter (on every world size, powers of two and not).
TEST(allgather_reduce_scatter_gather_scatter_alltoall) {
  Config config = small_chunks();
  for (bool latency : {false, true}) {
    config.allgather_algo = latency ? AlgoChoice::kBruck : AlgoChoice::kRing;
    config.reduce_scatter_algo = latency ? AlgoChoice::kRecursiveDoubling : AlgoChoice::kRing;
    for (int world : kWorlds) {
      auto errors = run_world(world, [&](int rank, Communicator& comm) {
        for (size_t count : {size_t(0), size_t(1), size_t(5), size_t(333)}) {
          // allgather into separate buffers
          std::vector<int32_t> in(count);
          for (size_t i = 0; i < count; ++i) in[i] = rank * 1000 + static_cast<int32_t>(i);
          std::vector<std::vector<int32_t>> outs(world, std::vector<int32_t>(count, -1));
          std::vector<char*> ptrs;
          for (auto& o : outs) ptrs.push_back(reinterpret_cast<char*>(o.data()));
          comm.allgather(in.data(), count, DataType::kInt32, ptrs)->wait();
          for (int k = 0; k < world; ++k)
            for (size_t i = 0; i < count; ++i)
              if (outs[k][i] != k * 1000 + static_cast<int32_t>(i)) fail(Error::Kind::kInternal, "allgather wrong");
          // reduce_scatter: block k of every rank reduces into rank k
          std::vector<double> rs_in(count * world), rs_out(count, -1);
          for (size_t j = 0; j < rs_in.size(); ++j) rs_in[j] = value(rank, j, ReduceOp::kSum);
          comm.reduce_scatter(rs_in.data(), count, DataType::kFloat64, ReduceOp::kSum, rs_out.data())->wait();
          std::vector<float> avg_in(count * world), avg_out(count, -1);
          for (size_t j = 0; j < avg_in.size(); ++j) avg_in[j] = static_cast<float>(value(rank, j, ReduceOp::kAvg));
          comm.reduce_scatter(avg_in.data(), count, DataType::kFloat32, ReduceOp::kAvg, avg_out.data())->wait();
          for (size_t i = 0; i < count; ++i) {
            double want = reference(DataType::kFloat64, ReduceOp::kSum, world, rank * count + i);
            if (rs_out[i] != want) fail(Error::Kind::kInternal, "reduce_scatter wrong at ", i);
            if (std::fabs(avg_out[i] - reference(DataType::kFloat64, ReduceOp::kAvg, world, rank * count + i)) > 1e-6)
              fail(Error::Kind::kInternal, "reduce_scatter avg wrong at ", i);
          }
          // gather / scatter with every root
          for (int root = 0; root < world; ++root) {
            std::vector<std::vector<int32_t>> g(world, std::vector<int32_t>(count, -1));
            std::vector<char*> gp;
            for (auto& o : g) gp.push_back(reinterpret_cast<char*>(o.data()));
            comm.gather(in.data(), count, DataType::kInt32, rank == root ? gp : std::vector<char*>{}, root)->wait();
            if (rank == root)
              for (int k = 0; k < world; ++k)
                for (size_t i = 0; i < count; ++i)
                  if (g[k][i] != k * 1000 + static_cast<int32_t>(i)) fail(Error::Kind::kInternal, "gather wrong");
            std::vector<std::vector<int32_t>> s(world, std::vector<int32_t>(count));
            std::vector<const char*> sp;
            for (int k = 0; k < world; ++k) {
              for (size_t i = 0; i < count; ++i) s[k][i] = root * 100 + k * 10 + static_cast<int32_t>(i);
              sp.push_back(reinterpret_cast<const char*>(s[k].data()));
            }
            std::vector<int32_t> got(count, -1);
            comm.scatter(rank == root ? sp : std::vector<const char*>{}, got.data(), count, DataType::kInt32, root)->wait();
            for (size_t i = 0; i < count; ++i)
              if (got[i] != root * 100 + rank * 10 + static_cast<int32_t>(i)) fail(Error::Kind::kInternal, "scatter wrong");
          }
        }
        // alltoall with uneven splits: rank r sends (r + k) % 3 elements to rank k
        std::vector<size_t> send_counts(world), recv_counts(world);
        for (int k = 0; k < world; ++k) {
          send_counts[k] = (rank + k) % 3;
          recv_counts[k] = (k + rank) % 3;
        }
        std::vector<int64_t> sbuf, rbuf;
        for (int k = 0; k < world; ++k)
          for (size_t i = 0; i < send_counts[k]; ++i) sbuf.push_back(rank * 100 + k * 10 + static_cast<int64_t>(i));
        size_t total = 0;
        for (size_t c : recv_counts) total += c;
        rbuf.assign(total + 1, -1);
        comm.alltoall(sbuf.data(), send_counts, rbuf.data(), recv_counts, DataType::kInt64)->wait();
        size_t at = 0;
        for (int k = 0; k < world; ++k)
          for (size_t i = 0; i < recv_counts[k]; ++i, ++at)
            if (rbuf[at] != k * 100 + rank * 10 + static_cast<int64_t>(i)) fail(Error::Kind::kInternal, "alltoall wrong");
        comm.barrier()->wait();
      }, std::chrono::seconds(60), config);
      check_world(errors, latency ? "exchange (bruck, rd)" : "exchange (ring)", world);
    }
  }
}

TEST(send_recv_and_any_source) {
  for (int world : {2, 3, 5}) {
    auto errors = run_world(world, [&](int rank, Communicator& comm) {
      // ring exchange, both directions posted before waiting
      int right = (rank + 1) % world, left = (rank + world - 1) % world;
      std::vector<float> out(1000, static_cast<float>(rank)), in(1000, -1);
      auto s = comm.send(out.data(), out.size(), DataType::kFloat32, right, 7);
      auto r = comm.recv(in.data(), in.size(), DataType::kFloat32, left, 7);
      r->wait();
      s->wait();
      for (float v : in)
        if (v != static_cast<float>(left)) fail(Error::Kind::kInternal, "ring recv wrong");
      // everyone sends to rank 0, which receives from any source
      if (rank == 0) {
        std::vector<int> seen;
        for (int i = 1; i < world; ++i) {
          int64_t got = -1;
          auto w = comm.recv(&got, 1, DataType::kInt64, kAnySource, 9);
          w->wait();
          if (got != w->source() * 11) fail(Error::Kind::kInternal, "any-source payload does not match its source");
          seen.push_back(w->source());
        }
        if (static_cast<int>(seen.size()) != world - 1) fail(Error::Kind::kInternal, "missing any-source messages");
      } else {
        int64_t v = rank * 11;
        comm.send(&v, 1, DataType::kInt64, 0, 9)->wait();
      }
      comm.barrier()->wait();
    });
    check_world(errors, "send/recv", world);
  }
}

TEST(large_multi_megabyte_allreduce) {
  for (int world : {3, 4}) {
    auto errors = run_world(world, [&](int rank, Communicator& comm) {
      const size_t count = (3u << 20) + 17;  // ~12 MB of float32, uneven segments
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(value(rank, i, ReduceOp::kSum));
      comm.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum)->wait();
      for (size_t i = 0; i < count; i += 997)
        if (buf[i] != static_cast<float>(reference(DataType::kFloat32, ReduceOp::kSum, world, i)))
          fail(Error::Kind::kInternal, "large allreduce wrong at ", i);
    });
    check_world(errors, "large allreduce", world);
  }
}

TEST(async_handles_complete_in_order) {
  auto errors = run_world(3, [&](int rank, Communicator& comm) {
    std::vector<std::vector<int32_t>> bufs(20, std::vector<int32_t>(100, rank + 1));
    std::vector<WorkPtr> works;
    int callbacks = 0;
    for (auto& b : bufs) works.push_back(comm.allreduce(b.data(), b.size(), DataType::kInt32, ReduceOp::kSum,
                                                        [&](std::exception_ptr e) { if (!e) ++callbacks; }));
    for (auto& w : works) w->wait();
    for (auto& b : bufs)
      for (int32_t v : b)
        if (v != 6) fail(Error::Kind::kInternal, "async allreduce wrong");
    if (callbacks != 20) fail(Error::Kind::kInternal, "callbacks ran ", callbacks, " times");
  });
  check_world(errors, "async", 3);
}

MCCL_TEST_MAIN
