#include "clock.h"

namespace mccl {

int64_t steady_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

int64_t steady_now_ns() { return steady_ns(std::chrono::steady_clock::now()); }

}  // namespace mccl
