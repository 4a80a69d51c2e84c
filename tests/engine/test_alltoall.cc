// The all-to-all under each of its schedules (MCCL_ALLTOALL_WINDOW: every peer at once, or the pairwise
// exchange with W rounds in flight, gated on both ends of a round or on its send), on threads over loopback:
// every block checked exactly, with blocks of unequal sizes and empty ones. The settings' parsing:
// test_select.cc.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "local_world.h"

using namespace mccl;
using mccl_test::run_world_configs;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Elements rank `from` sends rank `to` in call `salt`: empty, a few, or a block large enough to be split
// across lanes and written by the sender thread (when the variants turn those on).
size_t block(int from, int to, int salt) {
  const int kind = (from * 7 + to * 3 + salt) % 6;
  return kind == 0 ? 0 : kind == 5 ? mccl_test::sized(40000, 4000) : static_cast<size_t>(kind);
}
int64_t element(int from, int to, size_t i) { return from * 100'000'000ll + to * 1'000'000ll + static_cast<int64_t>(i); }

// Two all-to-alls issued back to back (the second one's frames may come before the first is done), each block
// checked against what its sender put there; the output's slot after the last block must stay untouched.
void exchange_and_check(int rank, Communicator& comm) {
  const int n = comm.size();
  std::vector<std::vector<int64_t>> ins(2), outs(2);
  std::vector<std::vector<size_t>> send_counts(2, std::vector<size_t>(n)), recv_counts = send_counts;
  std::vector<WorkPtr> works;
  for (int salt = 0; salt < 2; ++salt) {
    size_t received = 0;
    for (int k = 0; k < n; ++k) {
      send_counts[salt][k] = block(rank, k, salt);
      recv_counts[salt][k] = block(k, rank, salt);
      received += recv_counts[salt][k];
      for (size_t i = 0; i < send_counts[salt][k]; ++i) ins[salt].push_back(element(rank, k, i));
    }
    outs[salt].assign(received + 1, -1);
    works.push_back(comm.alltoall(ins[salt].data(), send_counts[salt], outs[salt].data(), recv_counts[salt],
                                  DataType::kInt64));
  }
  for (int salt = 0; salt < 2; ++salt) {
    works[salt]->wait();
    size_t at = 0;
    for (int k = 0; k < n; ++k)
      for (size_t i = 0; i < recv_counts[salt][k]; ++i, ++at)
        if (outs[salt][at] != element(k, rank, i))
          fail(Error::Kind::kInternal, "call ", salt, ": element ", i, " from rank ", k, " is ", outs[salt][at]);
    if (outs[salt][at] != -1) fail(Error::Kind::kInternal, "call ", salt, ": wrote past the last block");
  }
}

Config schedule(size_t window, bool gate_send) {
  Config c = Config::global();
  c.alltoall_window = window;
  c.alltoall_gate_send = gate_send;
  return c;
}

void check_world(const std::vector<std::string>& errors, const std::string& what, int world) {
  for (size_t r = 0; r < errors.size(); ++r)
    CHECK_MSG(errors[r].empty(), "%s, world %d, rank %zu: %s", what.c_str(), world, r, errors[r].c_str());
}

}  // namespace

// W = 0 (every peer at once), 1, 2, n-1 (every round at once, pairwise) and n+3 (more than there are rounds).
TEST(every_window_delivers_every_block) {
  for (int world : {1, 2, 3, 5, 8}) {
    for (size_t window : {size_t(0), size_t(1), size_t(2), size_t(world - 1), size_t(world + 3)}) {
      for (bool gate_send : {false, true}) {
        if (window == 0 && gate_send) continue;  // the gate applies to the pairwise exchange alone
        auto errors = run_world_configs(world, exchange_and_check, std::chrono::seconds(60),
                                        std::vector<Config>(world, schedule(window, gate_send)));
        check_world(errors, "window " + std::to_string(window) + (gate_send ? " gated on sends" : ""), world);
      }
    }
  }
}

// The schedule changes no frame: ranks with different windows and gates exchange correctly.
TEST(ranks_with_different_windows_agree) {
  for (int world : {3, 5, 8}) {
    std::vector<Config> configs;
    for (int r = 0; r < world; ++r) configs.push_back(schedule(static_cast<size_t>(r % 3), r % 2 == 1));
    check_world(run_world_configs(world, exchange_and_check, std::chrono::seconds(60), configs), "mixed windows", world);
  }
}

// A block whose size the receiver does not expect fails every rank under the pairwise schedule, naming the
// mismatch, and nothing hangs waiting for a round that cannot finish.
TEST(a_mismatched_block_fails_every_rank) {
  const int world = 4;
  auto errors = run_world_configs(world, [](int rank, Communicator& comm) {
    std::vector<size_t> send_counts(world, 2), recv_counts(world, 2);
    if (rank == 2) recv_counts[1] = 3;  // rank 1 sends 2
    std::vector<int64_t> in(2 * world, rank), out(2 * world + 1, -1);
    comm.alltoall(in.data(), send_counts, out.data(), recv_counts, DataType::kInt64)->wait();
  }, std::chrono::seconds(10), std::vector<Config>(world, schedule(1, false)));
  for (int r = 0; r < world; ++r) CHECK_MSG(contains(errors[r], "mismatch"), "rank %d: %s", r, errors[r].c_str());
  CHECK_MSG(contains(errors[2], "rank 1 called alltoall #0 of 2 int64, but rank 2 called alltoall #0 of 3 int64"), "%s",
            errors[2].c_str());
}

MCCL_TEST_MAIN
