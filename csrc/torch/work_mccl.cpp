#include "work_mccl.hpp"

#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <thread>

#include "errors.hpp"
#include "thread_name.h"

namespace lightning_mccl {
namespace {

// Runs the completion of each WorkMCCL (copy-back to the device, then the Future, whose callbacks
// run inline) off the engine's progress thread. A callback may itself issue a collective and wait
// for it, as PowerSGD's hooks do; so a blocked task never stalls the others: when no worker is idle,
// the pool starts another one (up to kMaxThreads). One pool per process, never torn down, so that a
// process group destroyed from inside a callback does not join its own thread.
class CompletionPool {
 public:
  static CompletionPool& instance() {
    static auto* pool = new CompletionPool();
    return *pool;
  }

  void post(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    // A worker that has finished its task and is coming back for the next (returning_) takes this one:
    // counting it avoids starting a thread that would only ever idle. A worker still inside a task is
    // not counted: that task may wait on this very completion.
    if (idle_ + returning_.load() == 0 && threads_ < kMaxThreads) {
      ++threads_;
      std::thread([this] {
        mccl::set_thread_name("mccl-complete");
        work();
      }).detach();
    }
    cv_.notify_one();
  }

 private:
  static constexpr int kMaxThreads = 64;

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [this] { return !tasks_.empty(); });
      --idle_;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      ++returning_;
      lock.lock();
      --returning_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  int idle_ = 0;
  std::atomic<int> returning_{0};  // finished a task, not yet back under the lock
  int threads_ = 0;
};

}  // namespace

WorkMCCL::WorkMCCL(c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(-1, type), outputs_(std::move(outputs)) {
  std::vector<c10::Device> devices;
  for (const auto& t : outputs_) {
    if (t.defined() && !t.device().is_cpu() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end())
      devices.push_back(t.device());
  }
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
}

void WorkMCCL::complete(std::exception_ptr error) {
  if (error) future_->setError(to_torch(error));
  else future_->markCompleted(c10::IValue(outputs_));
}

void WorkMCCL::set_staged(std::function<void()> copy_back, std::optional<c10::Stream> stream) {
  copy_back_ = std::move(copy_back);
  completion_stream_ = stream;
  future_wanted_ = staged_ = true;
}

bool WorkMCCL::attach(mccl::WorkPtr engine_work) {
  std::lock_guard<std::mutex> lock(mu_);
  engine_work_ = std::move(engine_work);
  attached_ = true;
  return engine_done_ && future_wanted_;
}

bool WorkMCCL::engine_finished(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mu_);
  engine_done_ = true;
  engine_error_ = error ? to_torch(error) : nullptr;
  return future_wanted_ && attached_;
}

void WorkMCCL::complete_on_pool(c10::intrusive_ptr<WorkMCCL> self) {
  CompletionPool::instance().post([self = std::move(self)] {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      error = self->engine_error_;
    }
    {
      mccl::Work::CompletionScope scope(*self->engine_work_);
      // Accelerator outputs: copied back on the staging stream, and the Future's events are recorded
      // on it, so whoever consumes the Future waits for the copy on the device, not on the host.
      c10::OptionalStreamGuard stream(self->completion_stream_);
      if (!error && self->copy_back_) {
        try {
          self->copy_back_();
        } catch (...) {
          error = std::current_exception();
        }
      }
      self->complete(error);
    }
    self->engine_work_->completion_returned();
  });
}

c10::intrusive_ptr<c10::ivalue::Future> WorkMCCL::getFuture() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool first = !future_requested_;
    future_requested_ = true;
    // Not finished yet (or staged: completed on the pool anyway): the pool completes it, and until
    // that completion returns, the collectives issued after this one wait (issue_order.h).
    if (future_wanted_ || !engine_done_) {
      future_wanted_ = true;
      if (first) engine_work_->hold_successors();
      return future_;
    }
    future_wanted_ = true;
    error = engine_error_;
  }
  // Finished before anyone asked: complete it here, on the caller's thread. It has no callbacks yet;
  // those added now run inline on this thread, in its issue order.
  complete(error);
  return future_;
}

bool WorkMCCL::isCompleted() {
  if (staged_) return future_->completed();
  std::lock_guard<std::mutex> lock(mu_);
  return engine_done_;
}

bool WorkMCCL::isSuccess() const {
  if (staged_) return future_->completed() && !future_->hasError();
  std::lock_guard<std::mutex> lock(mu_);
  return engine_done_ && !engine_error_;
}

std::exception_ptr WorkMCCL::exception() const {
  if (staged_) return future_->hasError() ? future_->exception_ptr() : nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return engine_error_;
}

int WorkMCCL::sourceRank() const { return engine_work_ ? engine_work_->source() : -1; }
std::vector<at::Tensor> WorkMCCL::result() { return outputs_; }

bool WorkMCCL::wait(std::chrono::milliseconds timeout) {
  // Every engine operation ends by itself (collectives and p2p carry the process group's timeout),
  // so without an explicit timeout this blocks until then.
  if (timeout == kNoTimeout) {
    translated([&] { engine_work_->wait(); });
  } else if (!translated([&] { return engine_work_->wait_for(timeout); })) {
    throw_torch(mccl::Error(mccl::Error::Kind::kTimeout,
                            c10::str("MCCL timeout: ", c10d::opTypeToString(opType_), " did not complete within ",
                                     timeout.count(), " ms")));
  }
  if (staged_) {
    future_->wait();  // the completion pool finishes it right after the engine (copy-back included)
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  }
  return true;
}

}  // namespace lightning_mccl
