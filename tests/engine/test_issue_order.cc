// The completion order of collectives (issue_order.h, docs/completion-order.md): first the tree on its
// own (which collective the progress thread starts next), then ranks whose completion callbacks issue
// collectives at rank-dependent moments and must still match, and a gate whose completion never
// returns, which must become a timeout naming it.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "issue_order.h"
#include "local_world.h"

using namespace mccl;
using mccl_test::run_world;

namespace {

struct Tree {
  std::shared_ptr<IssueOrder> order = std::make_shared<IssueOrder>([] {});
  uint64_t seq = 0;

  WorkPtr add(uint64_t count) {
    auto work = std::make_shared<Work>(nullptr);
    PendingCollective op;
    op.identity.count = count;
    op.work = work;
    order->add(std::move(op), order);
    return work;
  }
  // The count of the collective started next (it finishes at once), or -1 when none may start.
  int64_t run() {
    IssueOrder::Next next = order->next(seq, false);
    if (!next.run) return -1;
    CHECK(next.op.identity.seq == seq);
    ++seq;
    order->finished();
    return static_cast<int64_t>(next.op.identity.count);
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(plain_issue_order) {
  Tree t;
  t.add(1);
  t.add(2);
  CHECK(t.run() == 1);
  CHECK(t.run() == 2);
  CHECK(t.run() == -1);
  t.add(3);
  CHECK(t.run() == 3);
  CHECK(t.order->queued() == 0);
}

TEST(gate_holds_successors_and_runs_its_children_first) {
  Tree t;
  WorkPtr a = t.add(1);
  a->hold_successors();  // a future was requested before the next collective: a gate
  t.add(2);              // issued after the gate, in the root
  CHECK(t.run() == 1);
  CHECK(t.run() == -1);  // 2 waits for a's completion
  {
    Work::CompletionScope scope(*a);
    WorkPtr c = t.add(10);  // issued from a's completion: a's child
    c->hold_successors();   // and itself a gate (a callback waits on it)
    CHECK(t.run() == 10);
    t.add(11);              // a's next child waits for c's completion
    CHECK(t.run() == -1);
    {
      Work::CompletionScope inner(*c);
      t.add(100);           // c's child
    }
    c->completion_returned();
    CHECK(t.run() == 100);
    CHECK(t.run() == 11);
    CHECK(t.run() == -1);   // still inside a's completion
  }
  a->completion_returned();
  CHECK(t.run() == 2);
}

TEST(future_requested_after_the_next_issue_is_no_gate) {
  Tree t;
  WorkPtr a = t.add(1);
  t.add(2);
  a->hold_successors();  // too late: 2 was issued beside it already
  CHECK(t.run() == 1);
  CHECK(t.run() == 2);
}

TEST(completion_scope_of_a_non_gate_issues_at_the_root) {
  Tree t;
  WorkPtr a = t.add(1);
  t.add(2);
  {
    Work::CompletionScope scope(*a);  // a is no gate: its callbacks issue in program order
    t.add(3);
  }
  CHECK(t.run() == 1);
  CHECK(t.run() == 2);
  CHECK(t.run() == 3);
}

TEST(returned_before_requested_is_no_gate) {
  Tree t;
  WorkPtr a = t.add(1);
  CHECK(t.run() == 1);
  a->completion_returned();
  a->hold_successors();
  t.add(2);
  CHECK(t.run() == 2);
}

TEST(drop_queued_returns_unstarted_in_order) {
  Tree t;
  WorkPtr a = t.add(1);
  a->hold_successors();
  t.add(2);
  CHECK(t.run() == 1);
  {
    Work::CompletionScope scope(*a);
    t.add(3);
  }
  auto dropped = t.order->drop_queued();
  CHECK(dropped.size() == 2 && dropped[0].identity.count == 3 && dropped[1].identity.count == 2);
  CHECK(t.order->queued() == 0);
}

// Each rank: A (a gate), then B from the main thread; A's completion runs on another thread after a
// rank-dependent delay and issues C and D (C waited inside it). Execution order must be A C D B on
// every rank, or the ranks would mismatch (C, D and B have different sizes).
TEST(chained_completions_match_across_ranks) {
  const int world = 4;
  auto errors = run_world(world, [&](int rank, Communicator& comm) {
    for (int round = 0; round < 20; ++round) {
      std::vector<float> a(10, 1.0f), b(20, 1.0f), c(30, 1.0f), d(40, 1.0f);
      WorkPtr wa = comm.allreduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
      wa->hold_successors();
      std::exception_ptr completion_error;
      std::thread completion([&] {
        try {
          wa->wait();
          std::this_thread::sleep_for(std::chrono::microseconds(300 * ((rank + round) % 3)));
          {
            Work::CompletionScope scope(*wa);
            WorkPtr wc = comm.allreduce(c.data(), c.size(), DataType::kFloat32, ReduceOp::kSum);
            wc->hold_successors();
            wc->wait();
            wc->completion_returned();
            comm.allreduce(d.data(), d.size(), DataType::kFloat32, ReduceOp::kSum);
          }
        } catch (...) {
          completion_error = std::current_exception();
        }
        wa->completion_returned();
      });
      if ((rank + round) % 2) std::this_thread::sleep_for(std::chrono::microseconds(500));
      std::exception_ptr error;
      try {
        comm.allreduce(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
      } catch (...) {
        error = std::current_exception();
      }
      completion.join();
      if (error) std::rethrow_exception(error);
      if (completion_error) std::rethrow_exception(completion_error);
      for (float v : b) CHECK(v == world);
      for (float v : c) CHECK(v == world);
    }
    comm.barrier()->wait();
  });
  for (size_t r = 0; r < errors.size(); ++r) CHECK_MSG(errors[r].empty(), "rank %zu: %s", r, errors[r].c_str());
}

TEST(gate_that_never_returns_times_out_naming_it) {
  auto errors = run_world(2, [&](int, Communicator& comm) {
    std::vector<float> a(7, 1.0f), b(9, 1.0f);
    WorkPtr wa = comm.allreduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum);
    wa->hold_successors();
    wa->wait();  // its completion never returns
    comm.allreduce(b.data(), b.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
  }, std::chrono::milliseconds(1500));
  // Each rank times out on its own gate, or first hears of the peer's timeout.
  bool named = false;
  for (const auto& e : errors) {
    CHECK_MSG(!e.empty(), "a rank finished although its gate never returned");
    named = named || (contains(e, "timed out") && contains(e, "allreduce #0 of 7 float32") && contains(e, "never returns"));
  }
  CHECK_MSG(named, "%s | %s", errors[0].c_str(), errors[1].c_str());
}

MCCL_TEST_MAIN
