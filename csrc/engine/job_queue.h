// Whole jobs run by worker threads while the thread that handed them over goes on with its own work. The
// compressed reduce-scatter (algorithms/ring.cc) gives each received piece's widen-add-narrow to one, so the
// progress thread keeps receiving while several pieces are reduced at once, one thread each: a pipeline, where
// the reduction pool (reduce_pool.h) splits one piece over threads and makes its caller wait for all of them.
//
// A job's run() runs on a worker; then done() turns true (with release ordering, so the thread that sees it
// also sees what run() wrote), then notify() runs, then *in_worker (if set) drops by one. The submitter owns
// the job and may free it once done(); what notify() uses (a transport to wake) must live until *in_worker
// has dropped. Leaked on purpose with detached workers, like the reduction pool: process exit has nothing to
// tear down. In a forked child (whose workers did not come along), or without workers, submit() runs it at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include <unistd.h>

namespace mccl {

class JobQueue {
 public:
  struct Job {
    std::function<void()> run;
    std::function<void()> notify;         // after done: wakes whoever waits for it (Transport::wake)
    std::atomic<int>* in_worker = nullptr;  // raised by submit(), dropped after notify()
    bool done() const { return done_.load(std::memory_order_acquire); }

   private:
    friend class JobQueue;
    std::atomic<bool> done_{false};
  };

  static JobQueue& instance();  // kMaxReduceThreads workers (fewer on a machine with fewer CPUs)

  void submit(Job* job);
  // Blocks (yielding) until the count of jobs still in a worker reaches 0: before freeing what their
  // notify() uses, e.g. when unwinding after an error.
  static void wait_idle(const std::atomic<int>& in_worker);
  // Jobs run so far, by workers or at submit(): how tests see that work went this way.
  uint64_t completed() const { return completed_.load(std::memory_order_relaxed); }

 private:
  explicit JobQueue(size_t workers);
  void worker();
  void run(Job* job);

  const pid_t pid_;
  size_t workers_ = 0;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Job*> queue_;
  std::atomic<uint64_t> completed_{0};
};

}  // namespace mccl
