#include "stats.h"

#include "clock.h"
#include "wire.h"

namespace mccl {

void CommStats::collective_done(uint8_t kind, Clock::time_point issued, Clock::time_point started,
                                Clock::time_point done) {
  Counters& c = of(kind);
  add(c.calls, 1);
  add(c.busy_ns, ns_between(started, done));
  last_issued_ns_.store(steady_ns(issued), std::memory_order_relaxed);
  last_done_ns_.store(steady_ns(done), std::memory_order_relaxed);
}

CommStats::Snapshot CommStats::snapshot() const {
  Snapshot s;
  for (size_t k = 0; k < kinds_.size(); ++k) {
    const Counters& c = kinds_[k];
    KindSnapshot row{k >= 1 && k <= 10 ? collective_name(static_cast<CollectiveKind>(k)) : "other",
                     c.calls.load(std::memory_order_relaxed),
                     c.bytes_sent.load(std::memory_order_relaxed),
                     c.bytes_received.load(std::memory_order_relaxed),
                     c.busy_ns.load(std::memory_order_relaxed),
                     c.wait_ns.load(std::memory_order_relaxed)};
    if (row.calls || row.bytes_sent || row.bytes_received) s.kinds.push_back(std::move(row));
  }
  s.last_issued_ns = last_issued_ns_.load(std::memory_order_relaxed);
  s.last_done_ns = last_done_ns_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace mccl
