#include "transport/liveness.h"

#include <algorithm>
#include <cstdio>

namespace mccl {

void Liveness::configure(std::chrono::milliseconds interval, std::chrono::milliseconds timeout, Clock::time_point now) {
  on_ = timeout.count() > 0 && interval.count() > 0;
  timeout_ = timeout;
  interval_ = std::min<Clock::duration>(interval, timeout / 4);
  if (interval_ < std::chrono::milliseconds(1)) interval_ = std::chrono::milliseconds(1);
  next_check_ = now;
}

// Measured from the last round's clock reading: at worst it wakes a round's work late.
int Liveness::clamp(int timeout_ms, Clock::time_point now) const {
  if (!on_) return timeout_ms;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_check_ - now).count();
  int cap = left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
  return (timeout_ms < 0 || timeout_ms > cap) ? cap : timeout_ms;
}

bool Liveness::due(Clock::time_point now) {
  if (!on_ || now < next_check_) return false;
  next_check_ = now + interval_ / 2;
  return true;
}

std::string Liveness::silence(int rank, const std::string& peer, Clock::time_point last_heard, Clock::time_point now,
                              const std::string& during) const {
  char seconds[32], limit[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", std::chrono::duration<double>(now - last_heard).count());
  std::snprintf(limit, sizeof(limit), "%g", std::chrono::duration<double>(timeout_).count());
  return "MCCL heartbeat timeout: rank " + std::to_string(rank) + " heard nothing from " + peer + " for " + seconds +
         " s (MCCL_HEARTBEAT_TIMEOUT=" + limit + ") " + during +
         ": that process is stopped (SIGSTOP, a debugger), its machine is asleep, or the network between them is down";
}

}  // namespace mccl
