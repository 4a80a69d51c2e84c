#include "work.h"

#include "issue_order.h"

namespace mccl {

namespace {
// Adds the time from its construction to its destruction to a wait counter (none: no clock read).
class WaitTimer {
 public:
  explicit WaitTimer(std::atomic<uint64_t>* counter)
      : counter_(counter), start_(counter ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
  ~WaitTimer() {
    if (!counter_) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
    counter_->fetch_add(static_cast<uint64_t>(ns.count()), std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t>* counter_;
  std::chrono::steady_clock::time_point start_;
};
}  // namespace

bool Work::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::wait() {
  const bool pending = !done_.load(std::memory_order_acquire);
  WaitTimer timer(pending ? wait_ns_ : nullptr);
  SpinPolicy::Wait spin(pending ? spin_.get() : nullptr);  // ends (and teaches the policy) after the sleep below
  while (!done_.load(std::memory_order_acquire) && spin.spinning()) spin.pause();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_.load(); });
  if (error_) std::rethrow_exception(error_);
}

bool Work::wait_for(std::chrono::milliseconds timeout) {
  WaitTimer timer(done_.load(std::memory_order_acquire) ? nullptr : wait_ns_);
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return done_.load(); })) return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

void Work::finish(std::exception_ptr error, int source) {
  source_ = source;
  if (callback_) {
    try {
      callback_(error);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    callback_ = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = error;
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void Work::hold_successors() {
  if (!order_node_) return;
  if (auto order = order_node_->order.lock()) order->hold(*order_node_);
}

void Work::completion_returned() {
  if (!order_node_) return;
  if (auto order = order_node_->order.lock()) order->release(*order_node_);
}

}  // namespace mccl
