// Bad input and broken peers: each becomes an mccl::Error with the right kind and a message naming the
// cause, on every rank, and nothing hangs.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "local_world.h"
#include "reduce.h"

using namespace mccl;
using mccl_test::run_world;

namespace {
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The silent rank stays away until the waiting rank has raised (at most `limit`, well past its timeout),
// rather than sleeping a fixed time longer than the timeout.
void stay_away_until(const std::atomic<bool>& raised, std::chrono::milliseconds limit) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (!raised && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}
}  // namespace

TEST(mismatched_counts_fail_on_every_rank) {
  auto errors = run_world(3, [](int rank, Communicator& comm) {
    std::vector<float> buf(rank == 1 ? 12 : 10, 1.0f);
    comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
  }, std::chrono::seconds(10));
  // Every rank names the mismatch, not just the one that detected it (the others get its abort frame).
  for (int r = 0; r < 3; ++r)
    CHECK_MSG(contains(errors[r], "mismatch") && contains(errors[r], "12") && contains(errors[r], "10"), "rank %d: %s", r,
              errors[r].c_str());
}

TEST(mismatched_collectives_name_both_sides) {
  auto errors = run_world(2, [](int rank, Communicator& comm) {
    std::vector<float> buf(8, 1.0f);
    if (rank == 0) comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    else comm.broadcast(buf.data(), buf.size(), DataType::kFloat32, 0)->wait();
  }, std::chrono::seconds(10));
  for (auto& e : errors) CHECK_MSG(contains(e, "allreduce") && contains(e, "broadcast"), "%s", e.c_str());
}

// MCCL_CHUNK_BYTES sizes a ring's pieces. Ranks that differ send frames the others did not expect: with
// the lanes below matching, that is a mismatch naming both sides on every rank, with any MCCL_NSOCKS (the
// Hello no longer carries it).
TEST(ranks_with_other_chunk_sizes_get_a_mismatch) {
  std::vector<Config> configs(4, Config::global());
  for (int r = 0; r < 4; ++r) {
    configs[r].algo = AlgoChoice::kRing;
    configs[r].chunk_bytes = r == 3 ? 4096 : 65536;
  }
  const auto start = Clock::now();
  auto errors = mccl_test::run_world_configs(4, [](int, Communicator& comm) {
    std::vector<float> buf(1 << 16, 1.0f);
    comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
  }, std::chrono::seconds(20), configs);
  for (int r = 0; r < 4; ++r)
    CHECK_MSG(contains(errors[r], "mismatch") && contains(errors[r], "allreduce"), "rank %d: %s", r, errors[r].c_str());
  CHECK(Clock::now() - start < std::chrono::seconds(10));
}

TEST(a_broadcast_whose_root_differs_per_rank_is_a_mismatch) {
  // Both ranks believe they are the root, so both only send. The frame each one was sent is left unmatched:
  // at the end of the broadcast, or at the latest of the barrier (it arrives ahead of the barrier's frames).
  auto errors = run_world(2, [](int rank, Communicator& comm) {
    std::vector<float> buf(8, static_cast<float>(rank));
    comm.broadcast(buf.data(), buf.size(), DataType::kFloat32, rank)->wait();
    comm.barrier()->wait();
  }, std::chrono::seconds(10));
  for (int r = 0; r < 2; ++r)
    CHECK_MSG(contains(errors[r], "mismatch") && contains(errors[r], "broadcast"), "rank %d: '%s'", r, errors[r].c_str());
}

TEST(mismatched_dtypes_are_detected) {
  auto errors = run_world(2, [](int rank, Communicator& comm) {
    std::vector<double> buf(8, 1.0);
    comm.allreduce(buf.data(), 8, rank == 0 ? DataType::kFloat64 : DataType::kInt64, ReduceOp::kSum)->wait();
  }, std::chrono::seconds(10));
  for (auto& e : errors) CHECK_MSG(contains(e, "float64") && contains(e, "int64"), "%s", e.c_str());
}

TEST(unsupported_op_raises_at_the_call) {
  auto errors = run_world(2, [](int, Communicator& comm) {
    std::vector<float> buf(4);
    try {
      comm.allreduce(buf.data(), 4, DataType::kFloat32, ReduceOp::kBand);
      fail(Error::Kind::kInternal, "no error for band on float32");
    } catch (const Error& e) {
      if (e.kind() != Error::Kind::kInvalidArgument || !contains(e.what(), "band") || !contains(e.what(), "float32"))
        throw;
    }
    try {
      comm.broadcast(buf.data(), 4, DataType::kFloat32, 5);
      fail(Error::Kind::kInternal, "no error for root 5");
    } catch (const Error& e) {
      if (e.kind() != Error::Kind::kInvalidArgument || !contains(e.what(), "root")) throw;
    }
    comm.barrier()->wait();  // still usable: argument errors are not fatal
  });
  for (auto& e : errors) CHECK_MSG(e.empty(), "%s", e.c_str());
}

TEST(silent_peer_times_out_with_its_name) {
  auto start = std::chrono::steady_clock::now();
  std::atomic<bool> raised{false};
  auto errors = run_world(2, [&raised](int rank, Communicator& comm) {
    if (rank == 1) {
      stay_away_until(raised, std::chrono::milliseconds(5000));  // never joins the allreduce
      return;
    }
    std::vector<float> buf(4, 1.0f);
    try {
      comm.allreduce(buf.data(), 4, DataType::kFloat32, ReduceOp::kSum)->wait();
    } catch (...) {
      raised = true;
      throw;
    }
  }, std::chrono::seconds(1));
  auto took = std::chrono::steady_clock::now() - start;
  CHECK_MSG(contains(errors[0], "timeout") && contains(errors[0], "rank 1"), "%s", errors[0].c_str());
  CHECK(took < std::chrono::seconds(8));
}

TEST(dead_peer_fails_neighbours_fast_and_later_calls_rethrow) {
  auto errors = run_world(3, [](int rank, Communicator& comm) {
    std::vector<float> buf(1 << 16, 1.0f);
    comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    if (rank == 2) {
      // Its wait() ends when its own result is complete, while the others may still be receiving their last
      // pieces (from each other); its abort tells every peer at once and would fail their first allreduce too.
      // Dying after that allreduce is the case under test, so give them time to finish it.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comm.abort();  // closes its sockets, as a crashed process would
      return;
    }
    auto start = std::chrono::steady_clock::now();
    std::string first;
    try {
      comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    } catch (const Error& e) {
      first = e.what();
    }
    if (first.empty()) fail(Error::Kind::kInternal, "allreduce with a dead peer succeeded");
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(5))
      fail(Error::Kind::kInternal, "took longer than 5 s to notice");
    try {
      comm.barrier();
    } catch (const Error& e) {
      return;  // later calls rethrow
    }
    fail(Error::Kind::kInternal, "later call did not rethrow");
  }, std::chrono::seconds(20));
  for (int r = 0; r < 3; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
}

TEST(unmatched_recv_times_out_naming_peer_and_tag) {
  auto start = std::chrono::steady_clock::now();
  std::atomic<bool> raised{false};
  auto errors = run_world(2, [&raised](int rank, Communicator& comm) {
    if (rank == 1) {
      stay_away_until(raised, std::chrono::milliseconds(5000));  // never sends
      return;
    }
    float x = 0;
    try {
      comm.recv(&x, 1, DataType::kFloat32, 1, 5)->wait();
    } catch (...) {
      raised = true;
      throw;
    }
  }, std::chrono::milliseconds(800));
  auto took = std::chrono::steady_clock::now() - start;
  CHECK_MSG(contains(errors[0], "timed out") && contains(errors[0], "recv from rank 1") && contains(errors[0], "tag 5"),
            "%s", errors[0].c_str());
  CHECK(took < std::chrono::seconds(6));
}

// Receives nobody sends, issued by one thread while another shuts the communicator down or aborts it:
// every Work a call returned fails with kAborted (none is left pending once the progress thread has
// stopped), and the call that comes too late raises. Rounds stop at different moments of the stream.
void unmatched_recvs_fail_when_stopped(bool abort) {
  for (int round = 0; round < static_cast<int>(mccl_test::sized(20, 6)); ++round) {
    std::atomic<bool> checked{false};
    auto errors = run_world(2, [&](int rank, Communicator& comm) {
      if (rank == 1) {
        stay_away_until(checked, std::chrono::milliseconds(10000));  // never sends
        return;
      }
      std::thread stopper([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(250 * (round % 5)));
        if (abort) comm.abort();
        else comm.shutdown();
      });
      std::vector<WorkPtr> works;
      float x = 0;
      try {
        for (uint64_t tag = 0;; ++tag) works.push_back(comm.recv(&x, 1, DataType::kFloat32, 1, tag));
      } catch (const Error& e) {
        if (e.kind() != Error::Kind::kAborted) throw;
      }
      stopper.join();
      for (auto& work : works) {
        bool finished = false;
        try {
          finished = work->wait_for(std::chrono::seconds(5));
        } catch (const Error& e) {
          if (e.kind() != Error::Kind::kAborted) throw;
          continue;
        }
        fail(Error::Kind::kInternal, finished ? "a recv nobody sent succeeded" : "a recv was left pending");
      }
      checked = true;
    }, std::chrono::seconds(20));
    for (int r = 0; r < 2; ++r) CHECK_MSG(errors[r].empty(), "round %d, rank %d: %s", round, r, errors[r].c_str());
  }
}

TEST(unmatched_recvs_fail_at_shutdown) { unmatched_recvs_fail_when_stopped(false); }

TEST(unmatched_recvs_fail_at_abort) { unmatched_recvs_fail_when_stopped(true); }

TEST(missing_rank_times_out_in_rendezvous) {
  mccl_test::MemoryStore store(std::chrono::milliseconds(500));
  std::string message;
  try {
    Communicator comm(store, 0, 2, std::chrono::milliseconds(1000), "127.0.0.1");
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK_MSG(contains(message, "rank 1") || contains(message, "higher rank"), "%s", message.c_str());
}

MCCL_TEST_MAIN
