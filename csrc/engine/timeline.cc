#include "timeline.h"

#include "dtype.h"

namespace mccl {

void Timeline::record(const FrameHeader& identity, Clock::time_point issued, Clock::time_point started,
                      Clock::time_point ready, Clock::time_point done) {
  if (capacity_ == 0) return;
  const uint64_t bytes = identity.count * dtype_size(static_cast<DataType>(identity.dtype));
  // FrameHeader::wire_dtype: 0 when the payload travels as `dtype`, else the DataType it travels in.
  const uint64_t wire_bytes =
      identity.wire_dtype == 0 ? bytes : identity.count * dtype_size(static_cast<DataType>(identity.wire_dtype));
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
