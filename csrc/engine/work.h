// A handle on one queued operation: it completes or fails exactly once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "spin.h"

namespace mccl {

struct OrderNode;  // issue_order.h
const OrderNode* completion_scope_enter(const OrderNode* node);
void completion_scope_leave(const OrderNode* previous);

// Runs on the progress thread when the operation ends, before waiters wake: nullptr on success.
using Callback = std::function<void(std::exception_ptr)>;

class Work {
 public:
  bool completed() const;
  // Blocks until the operation ends; rethrows its error. Spins first as spin_with()'s policy says.
  void wait();
  // Like wait() but gives up after `timeout`: returns false then (the operation goes on).
  bool wait_for(std::chrono::milliseconds timeout);
  // For a receive from any source: the rank it came from (-1 before completion).
  int source() const { return source_; }

  // Called once by the communicator.
  void finish(std::exception_ptr error, int source = -1);

  // The completion order of collectives (issue_order.h), for a layer that completes futures. No-ops
  // for point-to-point work.
  // Someone will hear of this collective's completion: unless a collective was already issued after
  // it (in the same context), the collectives issued after it wait until completion_returned().
  void hold_successors();
  // The completion (a future's callbacks, run inside a CompletionScope) has returned.
  void completion_returned();
  // While it lives on a thread, collectives issued on that thread are this one's children: they run
  // before the collectives it holds back.
  class CompletionScope {
   public:
    explicit CompletionScope(const Work& work) : previous_(completion_scope_enter(work.order_node_.get())) {}
    ~CompletionScope() { completion_scope_leave(previous_); }
    CompletionScope(const CompletionScope&) = delete;
    CompletionScope& operator=(const CompletionScope&) = delete;

   private:
    const OrderNode* previous_;
  };

  explicit Work(Callback callback) : callback_(std::move(callback)) {}
  // Time spent blocked in wait()/wait_for() is added to *counter (CommStats::Counters::wait_ns).
  void count_waits_in(std::atomic<uint64_t>* counter) { wait_ns_ = counter; }
  // wait() spins as `policy` (the communicator's, for its callers) says; none: it sleeps at once.
  void spin_with(std::shared_ptr<SpinPolicy> policy) { spin_ = std::move(policy); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};  // written under mu_, also read without it (spinning waiters)
  std::exception_ptr error_;
  int source_ = -1;
  Callback callback_;
  std::shared_ptr<OrderNode> order_node_;  // collectives: set by IssueOrder::add
  friend class IssueOrder;
  std::atomic<uint64_t>* wait_ns_ = nullptr;
  std::shared_ptr<SpinPolicy> spin_;
};
using WorkPtr = std::shared_ptr<Work>;

}  // namespace mccl
