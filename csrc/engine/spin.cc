#include "spin.h"

#include <algorithm>
#include <thread>

namespace mccl {
namespace {

std::atomic<int> g_spinning{0};  // threads of this process spinning now under an adaptive policy
std::atomic<int> g_limit{1 << 20};

// A slot, leaving `spare` more free.
bool take_slot(int spare) {
  if (g_spinning.fetch_add(1, std::memory_order_relaxed) + spare < g_limit.load(std::memory_order_relaxed)) return true;
  g_spinning.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

}  // namespace

void limit_spinning_threads(unsigned n) {
  const int want = static_cast<int>(std::max(1u, n));
  int now = g_limit.load(std::memory_order_relaxed);
  while (want < now && !g_limit.compare_exchange_weak(now, want, std::memory_order_relaxed)) {
  }
}

unsigned spinning_threads_limit() { return static_cast<unsigned>(g_limit.load(std::memory_order_relaxed)); }

SpinPolicy::SpinPolicy(bool adaptive, std::chrono::microseconds fixed, Site site)
    : adaptive_(adaptive),
      site_(site),
      budget_ns_(adaptive ? kInitial.count() : std::chrono::duration_cast<std::chrono::nanoseconds>(fixed).count()) {}

void SpinPolicy::learn(std::chrono::nanoseconds waited, bool descheduled) {
  if (!adaptive_) return;
  int64_t budget = budget_ns_.load(std::memory_order_relaxed);
  if (descheduled) {
    budget /= 2;
  } else {
    const int64_t w = waited.count();
    const int64_t target = w <= kCeiling.count() ? std::min<int64_t>(kCeiling.count(), 2 * w) : 0;
    budget += (target - budget) / 4;
  }
  budget_ns_.store(budget, std::memory_order_relaxed);  // concurrent waits may lose an update: harmless
}

bool SpinPolicy::Wait::spinning() {
  if (stopped_ || policy_ == nullptr) return false;
  const auto now = Clock::now();
  if (!started_) {
    started_ = true;
    start_ = now;
    const auto budget = policy_->budget();
    if (budget.count() <= 0 || (policy_->adaptive_ && !(slot_ = take_slot(policy_->site_ == Site::kHelper ? 1 : 0)))) {
      stopped_ = true;
      return false;
    }
    until_ = now + budget;
    return true;
  }
  if (now < until_) return true;
  stop();
  return false;
}

void SpinPolicy::Wait::pause() {
  const auto before = Clock::now();
  std::this_thread::yield();
  if (policy_ != nullptr && policy_->adaptive() && Clock::now() - before > kDescheduled) {
    descheduled_ = true;
    stop();
  }
}

void SpinPolicy::Wait::stop() {
  stopped_ = true;
  if (slot_) g_spinning.fetch_sub(1, std::memory_order_relaxed);
  slot_ = false;
}

void SpinPolicy::Wait::end() {
  if (!started_) return;
  stop();
  policy_->learn(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_), descheduled_);
  started_ = false;
}

}  // namespace mccl
