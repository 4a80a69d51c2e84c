#include "timeline.h"

#include "codec.h"
#include "dtype.h"

namespace mccl {

void Timeline::record(const FrameHeader& identity, Clock::time_point issued, Clock::time_point started,
                      Clock::time_point ready, Clock::time_point done) {
  if (capacity_ == 0) return;
  const uint64_t bytes = identity.count * dtype_size(static_cast<DataType>(identity.dtype));
  const uint64_t wire_bytes = wire_bytes_of(static_cast<WireType>(identity.wire_dtype),
                                            static_cast<DataType>(identity.dtype), identity.count);
  const TimelineEntry entry{identity.seq,       identity.kind,      bytes,           wire_bytes,
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
