// A flight recorder of one communicator's latest collectives, like the trace buffer of torch's NCCL
// process group: for each, when it was issued, when the progress thread picked it up, when its buffers
// were ready (the device copies into them done: a collective's start_after) and when it finished. That
// splits each collective's time from issue to completion into queued behind earlier ones or held by a
// gate (issued to started), waiting for device staging (started to ready) and running (ready to done):
// what a profile of a training step needs to tell where the time between its collectives went.
//
// A ring buffer of the last `capacity` collectives (MCCL_TIMELINE_ENTRIES), written by the progress
// thread once per collective and read by snapshot() from any thread, under a small mutex that only a
// snapshot can contend; nothing else on the data path. Capacity 0 records nothing. Failed collectives are
// recorded too: they happened. Point-to-point sends and receives are not collectives and are not in it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "clock.h"
#include "wire.h"

namespace mccl {

struct TimelineEntry {
  uint64_t seq = 0;    // the collective's sequence number, which matches it up across ranks
  uint8_t kind = 0;    // a CollectiveKind value
  // The collective's count x element size, in the caller's dtype (before MCCL_WIRE_DTYPE): the buffer of
  // allreduce, broadcast and reduce; one rank's block of allgather, reduce-scatter, gather and scatter; all
  // that alltoall sends; 0 for a barrier.
  uint64_t bytes = 0;
  // The same payload in the type it travels in: count x the size of MCCL_WIRE_DTYPE's type for a compressed
  // collective (a float32 reduction: allreduce, reduce-scatter, reduce), else == bytes.
  uint64_t wire_bytes = 0;
  // steady_ns() times (clock.h):
  int64_t issued = 0;   // enqueued by the caller
  int64_t started = 0;  // picked up by the progress thread
  int64_t ready = 0;    // its buffers ready (== started when it had nothing to wait for)
  int64_t done = 0;     // its body finished, right before its Work completes
};

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // Reserves the whole ring, so that record() never allocates on the progress thread.
  explicit Timeline(size_t capacity) : capacity_(capacity) { ring_.reserve(capacity_); }

  // Progress thread: the collective `identity` (its seq set) ran with these times.
  void record(const FrameHeader& identity, Clock::time_point issued, Clock::time_point started,
              Clock::time_point ready, Clock::time_point done);
  // Any thread: the recorded collectives, oldest first.
  std::vector<TimelineEntry> snapshot() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::vector<TimelineEntry> ring_;  // grows (in place) to capacity_, then the oldest entry is overwritten
  size_t oldest_ = 0;                // once full: the index of the oldest entry, the next to overwrite
};

}  // namespace mccl
