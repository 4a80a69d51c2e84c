#include "reduce_pool.h"

#include <unistd.h>  // getpid: a forked child must not wait on its parent's worker threads

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "config.h"
#include "cpus.h"
#include "thread_name.h"

namespace mccl {
namespace {

constexpr size_t kParallelBytes = size_t(4) << 20;  // run_split: below this, run inline on the caller

// One call's work: parts [0, parts) of `count` elements, each `chunk` long (the last may be shorter).
struct Task {
  const Range* body;
  size_t count;
  size_t chunk;
};

// Set while a thread runs a part: work it splits again runs inline (the caller already holds the pool).
// Parts never nest, so the guard that sets it, also when the part throws, resets it to false.
thread_local bool in_part = false;
struct InPart {
  InPart() { in_part = true; }
  ~InPart() { in_part = false; }
};

void run_part(const Task& t, size_t part) {
  size_t begin = part * t.chunk;
  if (begin >= t.count) return;
  InPart guard;
  (*t.body)(begin, std::min(t.chunk, t.count - begin));
}

// Persistent workers blocked on a condition variable. One job at a time: a caller that finds the pool
// busy (another communicator thread) runs its job inline instead of waiting. The caller does part 0
// itself; worker i does part i+1. A part that throws does not end the job early: the workers run on the
// caller's Task, so the caller waits for every part, then rethrows its own exception or else the first a
// worker caught. The pool is leaked on purpose, with detached workers, so process exit has nothing to
// tear down.
class Pool {
 public:
  static Pool* instance() {
    static Pool* pool = new Pool(std::min<size_t>(kMaxReduceThreads, process_cpus().cpus));
    return pool;
  }

  size_t width() const { return workers_ + 1; }

  // Runs task parts [0, parts) (parts <= width()) and returns true, or returns false if busy.
  bool try_run(const Task& task, size_t parts) {
    if (getpid() != pid_) return false;  // forked child: the workers did not come along
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      parts_ = parts;
      pending_ = parts - 1;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr error;
    try {
      run_part(task, 0);
    } catch (...) {
      error = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
    parts_ = 0;
    if (!error) std::swap(error, worker_error_);
    worker_error_ = nullptr;
    if (error) std::rethrow_exception(error);
    return true;
  }

 private:
  explicit Pool(size_t width) : pid_(getpid()) {
    size_t started = 0;
    for (size_t part = 1; part < width; ++part) {
      try {
        std::thread([this, part] {
          set_thread_name("mccl-reduce");
          worker(part);
        }).detach();
        ++started;
      } catch (const std::exception&) {
        break;  // could not start a thread: use the ones we have (possibly none: inline)
      }
    }
    workers_ = started;
  }

  void worker(size_t part) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (task_ == nullptr || part >= parts_) continue;  // job already over, or not needed for it
      const Task* task = task_;
      lock.unlock();
      std::exception_ptr error;
      try {
        run_part(*task, part);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error && !worker_error_) worker_error_ = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  const pid_t pid_;
  size_t workers_ = 0;
  std::mutex busy_;  // held for a whole job
  std::mutex mu_;    // guards the fields below
  std::condition_variable wake_, done_;
  const Task* task_ = nullptr;
  size_t parts_ = 0;
  size_t pending_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr worker_error_;  // the first exception of this job's workers, for the caller
};

}  // namespace

size_t pool_width() { return Pool::instance()->width(); }

bool try_run_parts(size_t count, size_t align, size_t max_parts, const Range& body) {
  if (in_part) return false;
  Pool* pool = Pool::instance();
  const size_t parts = std::min(max_parts == 0 ? pool->width() : max_parts, pool->width());
  if (parts <= 1) return false;
  size_t chunk = (count + parts - 1) / parts;
  chunk = (chunk + align - 1) / align * align;  // part boundaries on whole tiles / cache lines
  Task task{&body, count, chunk};
  return pool->try_run(task, std::min(parts, (count + chunk - 1) / chunk));
}

void run_split(Kernel fn, void* out, const void* a, const void* b, size_t count, size_t elem, int64_t divisor,
               size_t max_parts) {
  auto* o = static_cast<char*>(out);
  auto* x = static_cast<const char*>(a);
  auto* y = static_cast<const char*>(b);
  run_parts(count, kParallelBytes / elem, 64, max_parts, [&](size_t begin, size_t n) {
    const size_t off = begin * elem;
    fn(o + off, x ? x + off : nullptr, y ? y + off : nullptr, n, divisor);
  });
}

}  // namespace mccl
