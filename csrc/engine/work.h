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

namespace mccl {

// Runs on the progress thread when the operation ends, before waiters wake: nullptr on success.
using Callback = std::function<void(std::exception_ptr)>;

class Work {
 public:
  bool completed() const;
  // Blocks until the operation ends; rethrows its error. Checks for up to spin_us (yielding the CPU)
  // before it sleeps.
  void wait(uint32_t spin_us = 0);
  // Like wait() but gives up after `timeout`: returns false then (the operation goes on).
  bool wait_for(std::chrono::milliseconds timeout);
  std::exception_ptr error() const;
  // For a receive from any source: the rank it came from (-1 before completion).
  int source() const { return source_; }

  // Called once by the communicator.
  void finish(std::exception_ptr error, int source = -1);

  explicit Work(Callback callback) : callback_(std::move(callback)) {}
  // Time spent blocked in wait()/wait_for() is added to *counter (CommStats::Counters::wait_ns).
  void count_waits_in(std::atomic<uint64_t>* counter) { wait_ns_ = counter; }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};  // written under mu_, also read without it (spinning waiters)
  std::exception_ptr error_;
  int source_ = -1;
  Callback callback_;
  std::atomic<uint64_t>* wait_ns_ = nullptr;
};
using WorkPtr = std::shared_ptr<Work>;

}  // namespace mccl
