// Ordering between the caller's device streams and the engine, which reads and writes host memory on
// its own threads. One abstraction for every way an accelerator tensor reaches the engine (staging.hpp):
//
//   - before the engine touches memory that device work produces (or still reads), the host waits for
//     a mark recorded on that work's stream when the collective was issued: the caller's thread only
//     records it, the engine's progress thread waits for it right before the collective starts;
//   - device work that must come after other device work (a copy after the producer, a copy back
//     after the copy out) is ordered on the device, never by blocking the caller's thread;
//   - results the engine wrote are handed back through the Work's Future, whose events are recorded
//     on the stream that did the last write (staging.hpp: completion_stream), so consumers wait on
//     the device for it.
//
// Everything here goes through c10's device-generic Stream / Event / guard API, so CUDA and MPS share
// it (MPS: torch records its events with a commit of the stream's command buffer, so a host wait on
// one does not wait for work that was never submitted).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <vector>

namespace lightning_mccl {

using Mark = std::shared_ptr<c10::Event>;

// The stream this thread queues work on for `device` (what the caller's kernels run on).
c10::Stream current_stream(const c10::Device& device);
// One side stream per device, taken from the device's stream pool once (the current stream where the
// device has no pool: still ordered, not overlapped).
c10::Stream side_stream(const c10::Device& device);
// Recorded after everything queued on `stream` so far.
Mark mark(const c10::Stream& stream);
// Work queued on `later` from now on runs after everything queued on `earlier` so far (device side).
void order_after(const c10::Stream& earlier, const c10::Stream& later);
// For the engine's progress thread: blocks until every mark has completed. nullptr when there are none.
std::function<void()> host_wait(std::vector<Mark> marks);

}  // namespace lightning_mccl
