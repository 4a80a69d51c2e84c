// Liveness: heartbeats and silent peers (MCCL_HEARTBEAT_INTERVAL / MCCL_HEARTBEAT_TIMEOUT). The policy and
// its clock; the progress thread runs it once per round (Transport::check_liveness), reading the clock
// once per round (round_start), so the hot path pays nothing for it.
//
// With heartbeats on, progress() never sleeps longer than half a heartbeat period. Every half period, a
// peer that has been sent nothing for the interval gets a heartbeat (a payload-less control frame on
// lane 0, queued only when nothing else is, so a reused one is never queued twice), and a peer from which
// nothing at all arrived for the timeout fails the communicator with a message naming it.
#pragma once

#include <chrono>
#include <string>

#include "socket.h"

namespace mccl {

class Liveness {
 public:
  // A zero timeout (or interval) turns heartbeats off. The interval used is at most a quarter of the timeout.
  void configure(std::chrono::milliseconds interval, std::chrono::milliseconds timeout, Clock::time_point now);
  // poll()'s timeout, cut to the next check.
  int clamp(int timeout_ms, Clock::time_point now) const;
  // Whether a check is due at `now` (and if so, the next one is half a period later).
  bool due(Clock::time_point now);
  bool silent(Clock::time_point last_heard, Clock::time_point now) const { return now - last_heard > timeout_; }
  bool owes_heartbeat(Clock::time_point last_sent, Clock::time_point now) const { return now - last_sent >= interval_; }
  // The error for a peer that has been silent since `last_heard`: who, for how long, during what.
  std::string silence(int rank, const std::string& peer, Clock::time_point last_heard, Clock::time_point now,
                      const std::string& during) const;

 private:
  bool on_ = false;
  Clock::duration interval_{};
  Clock::duration timeout_{};
  Clock::time_point next_check_;
};

}  // namespace mccl
