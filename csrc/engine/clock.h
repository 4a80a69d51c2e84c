// The engine's clock for times it hands out: steady clock times (CLOCK_MONOTONIC / mach_absolute_time) as
// nanoseconds since the clock's epoch, the convention of CommStats (stats.h) and of the timeline
// (timeline.h); steady_now_ns() lets a caller mark a window in the same clock.
#pragma once

#include <chrono>
#include <cstdint>

namespace mccl {

int64_t steady_ns(std::chrono::steady_clock::time_point t);
int64_t steady_now_ns();

}  // namespace mccl
