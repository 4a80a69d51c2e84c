#include "timeline.h"

#include "dtype.h"

namespace mccl {

int64_t steady_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

int64_t steady_now_ns() { return steady_ns(std::chrono::steady_clock::now()); }

void Timeline::record(const FrameHeader& identity, Clock::time_point issued, Clock::time_point started,
                      Clock::time_point ready, Clock::time_point done) {
  if (capacity_ == 0) return;
  const TimelineEntry entry{identity.seq, identity.kind,
                            identity.count * dtype_size(static_cast<DataType>(identity.dtype)),
                            steady_ns(issued), steady_ns(started), steady_ns(ready), steady_ns(done)};
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_.size() < capacity_) {
    ring_.push_back(entry);
  } else {
    ring_[oldest_] = entry;
    oldest_ = (oldest_ + 1) % capacity_;
  }
}

std::vector<TimelineEntry> Timeline::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TimelineEntry> out;
  out.reserve(ring_.size());
  out.insert(out.end(), ring_.begin() + static_cast<std::ptrdiff_t>(oldest_), ring_.end());
  out.insert(out.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(oldest_));
  return out;
}

}  // namespace mccl
