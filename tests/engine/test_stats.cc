// CommStats (stats.h): the counters of a ring allreduce and a send/recv against their exact byte counts,
// the time a caller waited for late peers, and snapshots read from another thread while collectives run
// (for TSan: every counter is an atomic).
#include <atomic>
#include <thread>
#include <vector>

#include "check.h"
#include "local_world.h"

using namespace mccl;
using mccl_test::run_world;

namespace {

const CommStats::KindSnapshot* find(const CommStats::Snapshot& s, const char* kind) {
  for (const auto& k : s.kinds)
    if (k.kind == kind) return &k;
  return nullptr;
}

}  // namespace

TEST(ring_allreduce_and_send_recv_count_their_exact_bytes) {
  constexpr int kWorld = 4;
  constexpr size_t kCount = 4096;  // divisible by the world: equal ring segments
  Config config;
  config.algo = AlgoChoice::kRing;
  auto errors = run_world(kWorld, [&](int rank, Communicator& comm) {
    std::vector<float> data(kCount, 1.0f);
    comm.allreduce(data.data(), kCount, DataType::kFloat32, ReduceOp::kSum)->wait();
    std::vector<float> message(100, 2.0f);
    if (rank == 0) comm.send(message.data(), message.size(), DataType::kFloat32, 1, 7)->wait();
    if (rank == 1) comm.recv(message.data(), message.size(), DataType::kFloat32, 0, 7)->wait();
    const CommStats::Snapshot s = comm.stats();
    const auto* ar = find(s, "allreduce");
    CHECK(ar != nullptr);
    if (ar) {
      CHECK(ar->calls == 1);
      CHECK_MSG(ar->bytes_sent == 2 * (kWorld - 1) * kCount * sizeof(float) / kWorld, "rank %d sent %llu", rank,
                static_cast<unsigned long long>(ar->bytes_sent));
      CHECK(ar->bytes_received == ar->bytes_sent);
      CHECK(ar->busy_ns > 0);
    }
    const auto* p2p = find(s, "send/recv");
    if (rank < 2) {
      CHECK(p2p != nullptr);
      if (p2p) {
        CHECK(p2p->calls == 1);
        CHECK(p2p->bytes_sent == (rank == 0 ? 400u : 0u));
        CHECK(p2p->bytes_received == (rank == 1 ? 400u : 0u));
      }
    } else {
      CHECK(p2p == nullptr);
    }
    CHECK(s.last_issued_ns > 0 && s.last_issued_ns <= s.last_done_ns);
  }, std::chrono::seconds(30), config);
  for (int rank = 0; rank < kWorld; ++rank) CHECK_MSG(errors[rank].empty(), "rank %d: %s", rank, errors[rank].c_str());
}

TEST(a_caller_waiting_for_late_peers_is_counted_and_snapshots_race_nothing) {
  constexpr int kWorld = 3;
  constexpr auto kLate = std::chrono::milliseconds(200);
  auto errors = run_world(kWorld, [&](int rank, Communicator& comm) {
    std::atomic<bool> done{false};
    std::thread reader([&] {
      while (!done.load()) (void)comm.stats();
    });
    if (rank != 0) std::this_thread::sleep_for(kLate);
    std::vector<float> data(64, 1.0f);
    for (int i = 0; i < 20; ++i) comm.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    done = true;
    reader.join();
    const CommStats::Snapshot s = comm.stats();
    const auto* ar = find(s, "allreduce");
    CHECK(ar != nullptr && ar->calls == 20);
    if (ar && rank == 0) {
      const auto late_ns = static_cast<uint64_t>(std::chrono::nanoseconds(kLate).count());
      CHECK_MSG(ar->wait_ns >= late_ns * 8 / 10, "rank 0 waited %llu ns", static_cast<unsigned long long>(ar->wait_ns));
      CHECK(ar->busy_ns >= late_ns * 8 / 10);
    }
  });
  for (int rank = 0; rank < kWorld; ++rank) CHECK_MSG(errors[rank].empty(), "rank %d: %s", rank, errors[rank].c_str());
}

MCCL_TEST_MAIN
