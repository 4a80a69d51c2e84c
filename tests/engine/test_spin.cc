// The spin policy (spin.h): a fixed MCCL_SPIN_US spins that long and learns nothing; `auto` moves its budget
// towards twice the waits that end within the ceiling and towards 0 for longer ones, halves it when a yield
// gave the core away, and lets no more threads spin at once than the process's limit.
#include <atomic>
#include <chrono>
#include <thread>

#include "check.h"
#include "spin.h"

#if defined(__linux__)
#include <sched.h>
#endif

using namespace mccl;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;
constexpr SpinPolicy::Site kProgress = SpinPolicy::Site::kProgress, kHelper = SpinPolicy::Site::kHelper;

namespace {

// How long one wait spins (with nothing to wait for), and whether it spun at all.
nanoseconds spin_once(SpinPolicy& policy) {
  const auto start = SpinPolicy::Clock::now();
  SpinPolicy::Wait wait(&policy);
  while (wait.spinning()) wait.pause();
  return SpinPolicy::Clock::now() - start;
}

}  // namespace

TEST(fixed_spins_that_long_and_learns_nothing) {
  SpinPolicy fixed(false, 300us, kProgress);
  const nanoseconds took = spin_once(fixed);
  CHECK_MSG(took >= 300us && took < 50ms, "spun %lld ns", static_cast<long long>(took.count()));
  fixed.learn(10ms, true);
  CHECK(fixed.budget() == 300us);
  SpinPolicy never(false, 0us, kProgress);
  SpinPolicy::Wait wait(&never);
  CHECK(!wait.spinning());
  SpinPolicy::Wait none(nullptr);
  CHECK(!none.spinning());
}

TEST(adaptive_follows_the_waits) {
  SpinPolicy p(true, 0us, kProgress);
  CHECK(p.budget() == SpinPolicy::kInitial);
  for (int i = 0; i < 40; ++i) p.learn(30us, false);  // data came within 30 us: spin about twice that
  CHECK_MSG(p.budget() > 55us && p.budget() <= 60us, "%lld ns", static_cast<long long>(p.budget().count()));
  for (int i = 0; i < 40; ++i) p.learn(90us, false);
  CHECK(p.budget() > 170us && p.budget() <= 180us);
  for (int i = 0; i < 40; ++i) p.learn(SpinPolicy::kCeiling, false);  // never above the ceiling
  CHECK(p.budget() <= SpinPolicy::kCeiling && p.budget() > SpinPolicy::kCeiling * 9 / 10);
  const nanoseconds before = p.budget();
  p.learn(5ms, false);  // a long wait (DDP's gap between buckets): spinning would not have paid
  CHECK(p.budget() < before && p.budget() >= before / 2);
  for (int i = 0; i < 60; ++i) p.learn(5ms, false);
  CHECK_MSG(p.budget() < 1us, "%lld ns", static_cast<long long>(p.budget().count()));
  {
    SpinPolicy::Wait wait(&p);  // a budget of (almost) nothing spins (almost) not at all
    while (wait.spinning()) wait.pause();
  }
  for (int i = 0; i < 40; ++i) p.learn(20us, false);  // ... and learns again from waits that slept
  CHECK(p.budget() > 35us);
  const nanoseconds grown = p.budget();
  p.learn(20us, true);  // descheduled while spinning: halves
  CHECK(p.budget() == grown / 2);
}

TEST(a_wait_teaches_its_policy_on_end) {
  SpinPolicy p(true, 0us, kProgress);
  for (int i = 0; i < 40; ++i) p.learn(100us, false);
  const nanoseconds before = p.budget();
  {
    SpinPolicy::Wait wait(&p);
    CHECK(wait.spinning());
    std::this_thread::sleep_for(20ms);  // what it waited for came late (asleep): spinning would not have paid
  }
  CHECK(p.budget() < before);
  SpinPolicy::Wait unused(&p);  // a wait that never asked to spin teaches nothing
  unused.end();
  CHECK(p.budget() < before);
}

TEST(no_more_spinning_threads_than_the_limit) {
  limit_spinning_threads(8);
  limit_spinning_threads(2);
  limit_spinning_threads(4);  // the tightest stays
  CHECK(spinning_threads_limit() == 2);
  SpinPolicy progress(true, 0us, kProgress), other_progress(true, 0us, kProgress), caller(true, 0us, kHelper);
  {
    SpinPolicy::Wait first(&progress);
    CHECK(first.spinning());
    SpinPolicy::Wait helper(&caller);
    CHECK(!helper.spinning());  // a helper leaves the last slot to a progress thread
    SpinPolicy::Wait second(&other_progress);
    CHECK(second.spinning());
    SpinPolicy::Wait third(&other_progress);
    CHECK(!third.spinning());  // both slots taken: sleeps at once
  }
  SpinPolicy::Wait helper(&caller);
  CHECK(helper.spinning());  // with both free, a helper spins
  helper.end();
  limit_spinning_threads(0);  // at least one
  CHECK(spinning_threads_limit() == 1);
  SpinPolicy::Wait alone(&caller);
  CHECK(!alone.spinning());  // one slot: only the progress thread spins
  SpinPolicy::Wait first(&progress);
  CHECK(first.spinning());
  SpinPolicy fixed(false, 100us, kHelper);  // an explicit MCCL_SPIN_US is not limited
  SpinPolicy::Wait any(&fixed);
  CHECK(any.spinning());
}

#if defined(__linux__)
// A yield that hands the core to a thread with work stops the spin at once, and halves the budget.
TEST(a_yield_that_gives_the_core_away_stops_spinning) {
  cpu_set_t saved, one;
  sched_getaffinity(0, sizeof(saved), &saved);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &saved)) ++cpu;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  std::atomic<bool> stop{false};
  std::atomic<bool> running{false};
  std::thread busy([&] {  // computes on the same CPU as the spinner
    sched_setaffinity(0, sizeof(one), &one);
    running = true;
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  sched_setaffinity(0, sizeof(one), &one);
  while (!running) std::this_thread::yield();
  SpinPolicy p(true, 0us, kProgress);
  for (int i = 0; i < 40; ++i) p.learn(SpinPolicy::kCeiling, false);
  const nanoseconds before = p.budget();
  SpinPolicy::Wait wait(&p);
  int rounds = 0;
  while (wait.spinning() && rounds < 1000000) {
    wait.pause();
    ++rounds;
  }
  wait.end();
  stop = true;
  busy.join();
  sched_setaffinity(0, sizeof(saved), &saved);
  CHECK_MSG(p.budget() == before / 2, "budget %lld ns after %d rounds (was %lld)",
            static_cast<long long>(p.budget().count()), rounds, static_cast<long long>(before.count()));
}
#endif

MCCL_TEST_MAIN
