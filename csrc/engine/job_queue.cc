#include "job_queue.h"

#include <algorithm>
#include <exception>
#include <thread>

#include "config.h"
#include "thread_name.h"

namespace mccl {

JobQueue& JobQueue::instance() {
  static JobQueue* queue = new JobQueue(std::min<size_t>(kMaxReduceThreads, std::thread::hardware_concurrency()));
  return *queue;
}

JobQueue::JobQueue(size_t workers) : pid_(getpid()) {
  for (size_t i = 0; i < workers; ++i) {
    try {
      std::thread([this] {
        set_thread_name("mccl-jobs");
        worker();
      }).detach();
      ++workers_;
    } catch (const std::exception&) {
      break;  // could not start a thread: use the ones we have (none: submit() runs jobs itself)
    }
  }
}

void JobQueue::submit(Job* job) {
  if (job->in_worker) job->in_worker->fetch_add(1, std::memory_order_relaxed);
  if (workers_ == 0 || getpid() != pid_) return run(job);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(job);
  }
  ready_.notify_one();
}

void JobQueue::wait_idle(const std::atomic<int>& in_worker) {
  while (in_worker.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

// Jobs are element-wise kernels over memory the submitter owns: they do not throw. Once done_ is set the
// job may be gone, so what comes after it is taken out first.
void JobQueue::run(Job* job) {
  job->run();
  completed_.fetch_add(1, std::memory_order_relaxed);
  std::function<void()> notify = std::move(job->notify);
  std::atomic<int>* in_worker = job->in_worker;
  job->done_.store(true, std::memory_order_release);
  if (notify) notify();
  if (in_worker) in_worker->fetch_sub(1, std::memory_order_release);
}

void JobQueue::worker() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ready_.wait(lock, [&] { return !queue_.empty(); });
    Job* job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    run(job);
    lock.lock();
  }
}

}  // namespace mccl
