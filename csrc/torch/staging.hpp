// Staging: how each tensor's bytes reach the engine, which reads and writes contiguous host memory.
//
// CPU tensors that are contiguous are used in place; other CPU tensors are copied to a contiguous
// tensor and back. Accelerator tensors (CUDA, MPS) never stall the caller, and take one of two paths
// (host_memory.hpp decides, per tensor, at run time), both ordered by stream_order.hpp:
//   - in place, where the CPU can address the tensor's memory (MPS shared storage, CUDA tensors in
//     pinned host memory): the engine gets a CPU view of the same bytes. A mark recorded on the
//     caller's current stream at the call is what the engine's progress thread waits for before the
//     collective starts (the producer's kernels are done, and so are earlier readers of an output).
//     The engine's writes are done when the Work is, so whatever runs after wait() (or the Future)
//     sees them; nothing is copied back.
//   - staged: an event on the caller's stream orders a side stream (one per device) after the
//     caller's work; the side stream copies the tensor into a host buffer (pinned and reused for
//     CUDA: torch's caching host allocator) and records the mark the progress thread waits for.
//     The copy back runs on the completion pool, on the same side stream (so after the copy out, and
//     the host buffer is not reused before the device has read it). The Work's future is completed
//     with the side stream current, so its events are recorded after the copy back: wait(), value()
//     and `then` callbacks make the consumer's stream wait for them, and later kernels see the result.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include "stream_order.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace lightning_mccl {

struct Staged {
  at::Tensor user;    // what the caller passed
  at::Tensor host;    // contiguous CPU memory the engine reads and writes
  at::Tensor source;  // staged accelerator tensor: what the copy out reads (kept alive until it is done)
  bool copy_back = false;
  std::optional<c10::Stream> stream;  // staged accelerator tensor: the stream that copies back
  Mark start_after;  // accelerator: the engine starts after it (the copy out; in place: the caller's queued work)
};
using Staging = std::shared_ptr<std::vector<Staged>>;

void check_dense(const at::Tensor& t, const char* op, int rank);

// What the engine does with a tensor: reads its values (times `premul` when given: PREMUL_SUM), writes its
// result into it, or both.
enum class Access { kRead, kWrite, kReadWrite };
Staged stage(const at::Tensor& t, Access access, const char* op, int rank,
             const std::optional<at::Tensor>& premul = std::nullopt);
// Staging for tensors that travel packed in one host buffer (already on the host): each is copied
// back from its slice, ordered after the caller's current stream.
Staging unpack_into(const at::Tensor& packed, const std::vector<at::Tensor>& tensors);
// On the completion pool: copies results back (non-blocking for accelerator tensors).
void unstage(const Staged& s);
// For the progress thread, right before the collective starts: waits until every tensor is ready for
// the engine (copies out done; in place: the work queued before the call done). nullptr when there is
// nothing to wait for.
std::function<void()> ready(const Staging& staging);
// Blocks this thread until the same (for point-to-point work, which starts at once).
void wait_copied(const Staging& staging);
// The stream to complete the Work's future on (the first accelerator copy back's), if any.
std::optional<c10::Stream> completion_stream(const Staging& staging);

inline char* ptr(const Staged& s) { return static_cast<char*>(s.host.data_ptr()); }

}  // namespace lightning_mccl
