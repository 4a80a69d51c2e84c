// Waiting without sleeping. A thread that waits for what a peer or another thread will do soon (a peer's frame,
// the next collective, a collective's completion, the next frame to send) can poll for it, yielding the CPU
// between polls ("spin"), or sleep until woken (poll(), a condition variable). Spinning saves the wake-up, tens
// of microseconds, on every small collective; but a spinning thread holds a core that another thread may need:
// its own rank's compute, or another rank's on the same host.
//
// Each waiting site (a communicator's progress thread waiting for frames, the same thread between collectives,
// the group's callers in Work::wait, each sender thread) has a SpinPolicy. MCCL_SPIN_US=N fixes its spin to N
// microseconds (0: never); `auto`, the default, adapts it, as MPI progress engines and NCCL's proxy threads do:
//  - the budget follows what waiting took there: a wait that ended within kCeiling, spinning or asleep, moves it
//    towards twice that time (spinning pays, or would have); a longer one moves it towards 0 (DDP's gaps between
//    buckets, a slow link's pieces). An exponential average over the last few waits.
//  - a yield that took longer than kDescheduled means another thread wanted this core and ran: the wait stops
//    spinning and sleeps, and the budget halves (the host is oversubscribed: spinning would take its cores).
//  - at most spinning_threads_limit() threads of a process spin at once: its rank's share of the CPUs it may use
//    (cpus.h, divided among the ranks on its host), at least 1. The progress thread, which does the work, comes
//    first: a helper's wait (a caller's, a sender thread's) spins only while a slot is left beside it. A wait
//    that finds no slot sleeps at once.
// The measurements behind the constants: benchmarks/record/performance.md#many-ranks-and-spinning.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace mccl {

class SpinPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  // The most an adaptive budget spins, and the budget it starts from.
  static constexpr std::chrono::nanoseconds kCeiling = std::chrono::microseconds(200);
  static constexpr std::chrono::nanoseconds kInitial = std::chrono::microseconds(50);
  // A yield that returns later than this gave the core to a thread that computes: longer than the yields between
  // a rank's own threads, shorter than the slice a computing thread takes
  // (benchmarks/record/performance.md#many-ranks-and-spinning).
  static constexpr std::chrono::nanoseconds kDescheduled = std::chrono::microseconds(250);

  // Who waits: the progress thread, or a helper (a caller, a sender thread) that leaves it a slot.
  enum class Site { kProgress, kHelper };
  // MCCL_SPIN_US as Config holds it: adaptive (auto), else a fixed spin of `fixed` (0: never spin).
  SpinPolicy(bool adaptive, std::chrono::microseconds fixed, Site site);
  std::chrono::nanoseconds budget() const {
    return std::chrono::nanoseconds(budget_ns_.load(std::memory_order_relaxed));
  }
  bool adaptive() const { return adaptive_; }
  // The end of a wait that took `waited` (spinning and sleeping), descheduled or not while it spun.
  void learn(std::chrono::nanoseconds waited, bool descheduled);

  // One wait at a site. The waiter calls spinning() before each poll: true to poll once more without sleeping,
  // false (from then on) to sleep; pause() between polls yields the CPU. The wait teaches its policy how long it
  // took at end() (or destruction), so a Wait lives until what it waited for has come. No policy: never spins.
  class Wait {
   public:
    explicit Wait(SpinPolicy* policy) : policy_(policy) {}
    ~Wait() { end(); }
    Wait(const Wait&) = delete;
    Wait& operator=(const Wait&) = delete;
    bool spinning();
    void pause();
    void end();

   private:
    void stop();
    SpinPolicy* policy_;
    Clock::time_point start_{}, until_{};
    bool started_ = false, stopped_ = false, slot_ = false, descheduled_ = false;
  };

 private:
  const bool adaptive_;
  const Site site_;
  std::atomic<int64_t> budget_ns_;
};

// At most `n` threads of this process spin at once under an adaptive policy (each communicator sets its rank's
// share; the tightest stays).
void limit_spinning_threads(unsigned n);
unsigned spinning_threads_limit();

}  // namespace mccl
