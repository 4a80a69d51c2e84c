// Traffic counters of one communicator, always on: per collective kind, the calls, the payload bytes this
// rank put on and took off the wire (after MCCL_WIRE_DTYPE compression, frame headers not included), the
// time the operations ran (start to completion on the progress thread; a send/recv: post to completion),
// and the time callers spent blocked in Work::wait()/wait_for(). Plus the issue and completion times of the
// latest collective, from which a caller can tell how long its last collective kept it waiting after it
// was issued (the "exposed" tail of a step, where nothing is left to overlap it with).
//
// Every counter is a relaxed atomic, incremented on the thread that does the work (the progress thread,
// or the caller for waits): one uncontended add per frame or per operation, no lock on the data path.
// snapshot() reads them from any thread; counters read at slightly different moments may disagree by the
// operation in progress, never more.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace mccl {

class CommStats {
 public:
  using Clock = std::chrono::steady_clock;

  struct Counters {
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> bytes_sent{0};
    std::atomic<uint64_t> bytes_received{0};
    std::atomic<uint64_t> busy_ns{0};  // "time in flight"
    std::atomic<uint64_t> wait_ns{0};  // time callers were blocked waiting
  };

  struct KindSnapshot {
    std::string kind;  // collective_name(): "allreduce", ..., "send/recv"
    uint64_t calls, bytes_sent, bytes_received, busy_ns, wait_ns;
  };
  struct Snapshot {
    std::vector<KindSnapshot> kinds;  // only kinds with at least one call
    int64_t last_issued_ns = 0;       // steady clock (CLOCK_MONOTONIC / mach_absolute_time); 0: none yet
    int64_t last_done_ns = 0;
  };

  // `kind` is a CollectiveKind value (wire.h); anything else is counted under index 0 ("other").
  Counters& of(uint8_t kind) { return kinds_[kind < kinds_.size() ? kind : 0]; }

  void sent(uint8_t kind, uint64_t bytes) { add(of(kind).bytes_sent, bytes); }
  void received(uint8_t kind, uint64_t bytes) { add(of(kind).bytes_received, bytes); }
  // A collective ran from `started` to `done` after being issued at `issued`.
  void collective_done(uint8_t kind, Clock::time_point issued, Clock::time_point started, Clock::time_point done);
  static void add(std::atomic<uint64_t>& counter, uint64_t value) {
    counter.fetch_add(value, std::memory_order_relaxed);
  }
  static uint64_t ns_between(Clock::time_point a, Clock::time_point b) {
    return b > a ? static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count()) : 0;
  }

  Snapshot snapshot() const;

 private:
  std::array<Counters, 11> kinds_;  // indexed by CollectiveKind (1..10), 0 for anything else
  std::atomic<int64_t> last_issued_ns_{0};
  std::atomic<int64_t> last_done_ns_{0};
};

}  // namespace mccl
