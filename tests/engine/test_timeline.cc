// The communicator's timeline (timeline.h): each rank's record of a known sequence of collectives (seqs,
// kinds, payload bytes, times in order and inside the caller's window, a device wait shown as start to
// ready) while another thread reads it (for TSan), the ring keeping only the latest MCCL_TIMELINE_ENTRIES,
// 0 recording nothing, the bytes on the wire of compressed (MCCL_WIRE_DTYPE) and uncompressed collectives,
// and a failed collective recorded like the others, its wait for a ready step that threw shown as staging.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "check.h"
#include "local_world.h"

using namespace mccl;
using mccl_test::run_world;
using mccl_test::run_world_configs;

namespace {

constexpr auto kReadyWait = std::chrono::milliseconds(20);

// Three allreduces of different sizes and dtypes, then a broadcast whose buffers are "ready" only after
// kReadyWait (as the torch layer's device copies would be), all issued before any is waited for.
void issue_known_sequence(Communicator& comm) {
  std::vector<float> small(16, 1.0f), large(70'000, 1.0f), bcast(500, 1.0f);
  std::vector<double> wide(300, 1.0);
  std::vector<WorkPtr> works;
  works.push_back(comm.allreduce(small.data(), small.size(), DataType::kFloat32, ReduceOp::kSum));
  works.push_back(comm.allreduce(wide.data(), wide.size(), DataType::kFloat64, ReduceOp::kSum));
  works.push_back(comm.allreduce(large.data(), large.size(), DataType::kFloat32, ReduceOp::kSum));
  works.push_back(comm.broadcast(bcast.data(), bcast.size(), DataType::kFloat32, 0, nullptr,
                                 [] { std::this_thread::sleep_for(kReadyWait); }));
  for (auto& w : works) w->wait();
}

struct Expected {
  CollectiveKind kind;
  uint64_t bytes;
};
const Expected kSequence[] = {{CollectiveKind::kAllreduce, 16 * 4},
                              {CollectiveKind::kAllreduce, 300 * 8},
                              {CollectiveKind::kAllreduce, 70'000 * 4},
                              {CollectiveKind::kBroadcast, 500 * 4}};

void check_entry(int rank, const TimelineEntry& e, uint64_t seq) {
  CHECK_MSG(e.seq == seq, "rank %d: seq %llu, expected %llu", rank, static_cast<unsigned long long>(e.seq),
            static_cast<unsigned long long>(seq));
  CHECK(e.kind == static_cast<uint8_t>(kSequence[seq].kind));
  CHECK_MSG(e.bytes == kSequence[seq].bytes, "rank %d seq %llu: %llu bytes", rank,
            static_cast<unsigned long long>(seq), static_cast<unsigned long long>(e.bytes));
  CHECK(e.wire_bytes == e.bytes);  // uncompressed
  CHECK(e.issued <= e.started && e.started <= e.ready && e.ready <= e.done);
}

}  // namespace

TEST(each_rank_records_its_collectives_in_order_with_their_times) {
  constexpr int kWorld = 3;
  auto errors = run_world(kWorld, [&](int rank, Communicator& comm) {
    std::atomic<bool> finished{false};
    std::thread reader([&] {
      while (!finished.load()) {
        CHECK(comm.timeline().size() <= 4);
        std::this_thread::yield();
      }
    });
    const int64_t before = steady_now_ns();
    issue_known_sequence(comm);
    const int64_t after = steady_now_ns();
    finished = true;
    reader.join();
    const std::vector<TimelineEntry> t = comm.timeline();
    CHECK_MSG(t.size() == 4, "rank %d: %zu entries", rank, t.size());
    if (t.size() != 4) return;
    for (uint64_t k = 0; k < 4; ++k) check_entry(rank, t[k], k);
    for (size_t k = 0; k + 1 < t.size(); ++k) {
      CHECK(t[k].done <= t[k + 1].started);
      CHECK(t[k].issued <= t[k + 1].issued);  // issued in this order on one thread
    }
    CHECK(before <= t.front().issued && t.back().done <= after);
    for (size_t k = 0; k < 3; ++k) CHECK(t[k].ready == t[k].started);  // nothing to wait for
    CHECK_MSG(t[3].ready - t[3].started >= std::chrono::nanoseconds(kReadyWait).count(),
              "rank %d: the broadcast was ready %lld ns after it started", rank,
              static_cast<long long>(t[3].ready - t[3].started));
  });
  for (int rank = 0; rank < kWorld; ++rank) CHECK_MSG(errors[rank].empty(), "rank %d: %s", rank, errors[rank].c_str());
}

TEST(the_ring_keeps_the_latest_entries_and_zero_records_none) {
  // Per communicator, not compared between ranks: 2, 3 and 0 entries in one world.
  const std::vector<Config> configs = {Config::from_env({{"MCCL_TIMELINE_ENTRIES", "2"}}),
                                       Config::from_env({{"MCCL_TIMELINE_ENTRIES", "3"}}),
                                       Config::from_env({{"MCCL_TIMELINE_ENTRIES", "0"}})};
  CHECK(Config::from_env().timeline_entries == 2048);
  auto errors = run_world_configs(3, [&](int rank, Communicator& comm) {
    issue_known_sequence(comm);
    const std::vector<TimelineEntry> t = comm.timeline();
    const size_t kept = rank == 0 ? 2 : rank == 1 ? 3 : 0;
    CHECK_MSG(t.size() == kept, "rank %d: %zu entries, expected %zu", rank, t.size(), kept);
    if (t.size() != kept) return;
    for (size_t k = 0; k < kept; ++k) check_entry(rank, t[k], 4 - kept + k);
  }, std::chrono::seconds(30), configs);
  for (int rank = 0; rank < 3; ++rank) CHECK_MSG(errors[rank].empty(), "rank %d: %s", rank, errors[rank].c_str());
  bool rejected = false;
  try {
    Config::from_env({{"MCCL_TIMELINE_ENTRIES", "1000001"}});
  } catch (const Error& e) {
    rejected = e.kind() == Error::Kind::kInvalidArgument;
  }
  CHECK(rejected);
}

TEST(compressed_collectives_count_their_wire_bytes_in_the_wire_type) {
  // MCCL_WIRE_DTYPE compresses float32 reductions only: the allreduces' and the reduce-scatter's float32
  // payloads travel at half the bytes; the float64 allreduce and the broadcast travel as they are.
  for (const char* wire : {"bf16", "fp16"}) {
    const Config config = Config::from_env({{"MCCL_WIRE_DTYPE", wire}});
    auto errors = run_world(2, [&](int rank, Communicator& comm) {
      std::vector<float> a(1000, 1.0f), b(70'000, 1.0f), bcast(500, 1.0f), rs_in(2 * 300, 1.0f), rs_out(300);
      std::vector<double> wide(300, 1.0);
      std::vector<WorkPtr> works;
      works.push_back(comm.allreduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum));
      works.push_back(comm.allreduce(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum));
      works.push_back(comm.allreduce(wide.data(), wide.size(), DataType::kFloat64, ReduceOp::kSum));
      works.push_back(comm.broadcast(bcast.data(), bcast.size(), DataType::kFloat32, 0));
      works.push_back(comm.reduce_scatter(rs_in.data(), rs_out.size(), DataType::kFloat32, ReduceOp::kSum,
                                          rs_out.data()));
      for (auto& w : works) w->wait();
      const std::vector<TimelineEntry> t = comm.timeline();
      CHECK_MSG(t.size() == 5, "rank %d: %zu entries", rank, t.size());
      if (t.size() != 5) return;
      const uint64_t bytes[] = {1000 * 4, 70'000 * 4, 300 * 8, 500 * 4, 300 * 4};
      const uint64_t wire_bytes[] = {1000 * 2, 70'000 * 2, 300 * 8, 500 * 4, 300 * 2};
      for (size_t k = 0; k < 5; ++k)
        CHECK_MSG(t[k].bytes == bytes[k] && t[k].wire_bytes == wire_bytes[k],
                  "rank %d %s entry %zu: %llu bytes, %llu on the wire", rank, wire, k,
                  static_cast<unsigned long long>(t[k].bytes), static_cast<unsigned long long>(t[k].wire_bytes));
      CHECK(t[0].wire_bytes == t[0].bytes / 2 && t[3].wire_bytes == t[3].bytes);
    }, std::chrono::seconds(30), config);
    for (int rank = 0; rank < 2; ++rank) CHECK_MSG(errors[rank].empty(), "rank %d: %s", rank, errors[rank].c_str());
  }
}

TEST(a_failed_collective_is_recorded_too) {
  auto errors = run_world(1, [&](int, Communicator& comm) {
    std::vector<float> data(8, 1.0f);
    WorkPtr work = comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum, nullptr, [] {
      std::this_thread::sleep_for(kReadyWait);
      throw std::runtime_error("device copy failed");
    });
    bool failed = false;
    try {
      work->wait();
    } catch (const std::exception&) {
      failed = true;
    }
    CHECK(failed);
    const std::vector<TimelineEntry> t = comm.timeline();
    CHECK(t.size() == 1);
    if (t.size() == 1) {
      CHECK(t[0].seq == 0 && t[0].kind == static_cast<uint8_t>(CollectiveKind::kAllreduce) && t[0].bytes == 32);
      CHECK(t[0].issued <= t[0].started && t[0].started <= t[0].ready && t[0].ready <= t[0].done);
      // the time until the ready step threw shows as staging (started to ready), not as running
      CHECK_MSG(t[0].ready - t[0].started >= std::chrono::nanoseconds(kReadyWait).count(),
                "ready %lld ns after it started", static_cast<long long>(t[0].ready - t[0].started));
    }
  });
  CHECK_MSG(errors[0].empty(), "rank 0: %s", errors[0].c_str());
}

MCCL_TEST_MAIN
