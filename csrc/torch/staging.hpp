// Staging: tensors the engine cannot read in place travel through contiguous host memory.
//
// CPU tensors that are contiguous are used in place; other CPU tensors are copied to a contiguous
// tensor and back. Accelerator tensors (CUDA; MPS shares the code through c10's device-generic
// Stream / Event / guard API) never stall the caller:
//   - copy out: an event recorded on the caller's current stream orders a side stream (one per
//     device, from the device's pool) after the caller's work; the side stream copies the tensor into
//     pinned host memory (torch's caching host allocator: pinned and reused) and records `copied`.
//     The caller's thread only enqueues; the engine's progress thread waits for `copied` right before
//     the collective starts (ready()).
//   - copy back, on the completion pool: on the same side stream (so after the copy out, and the
//     host buffer is not reused before the device has read it). The Work's future is completed with
//     the side stream current, so its events are recorded after the copy back: wait(), value() and
//     `then` callbacks make the consumer's stream wait for them, and later kernels see the result.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace lightning_mccl {

struct Staged {
  at::Tensor user;    // what the caller passed
  at::Tensor host;    // contiguous CPU memory the engine reads and writes
  at::Tensor source;  // accelerator: what the copy out reads (kept alive until it is done)
  bool copy_back = false;
  std::optional<c10::Stream> stream;   // accelerator: the stream that copies back
  std::shared_ptr<c10::Event> copied;  // accelerator, read tensors: recorded after the copy out
};
using Staging = std::shared_ptr<std::vector<Staged>>;

void check_dense(const at::Tensor& t, const char* op, int rank);

// `read`: the engine reads the tensor's values (times `premul` when given: PREMUL_SUM); `write`: the
// engine's result must land in it.
Staged stage(const at::Tensor& t, bool read, bool write, const char* op, int rank,
             const std::optional<at::Tensor>& premul = std::nullopt);
// Staging for tensors that travel packed in one host buffer (already on the host): each is copied
// back from its slice, ordered after the caller's current stream.
Staging unpack_into(const at::Tensor& packed, const std::vector<at::Tensor>& tensors);
// On the completion pool: copies results back (non-blocking for accelerator tensors).
void unstage(const Staged& s);
// For the progress thread, right before the collective starts: waits until every copy out is done.
// nullptr when there is nothing to wait for.
std::function<void()> ready(const Staging& staging);
// Blocks this thread until the copies out are done (for point-to-point work, which starts at once).
void wait_copied(const Staging& staging);
// The stream to complete the Work's future on (the first accelerator copy back's), if any.
std::optional<c10::Stream> completion_stream(const Staging& staging);

inline char* ptr(const Staged& s) { return static_cast<char*>(s.host.data_ptr()); }

}  // namespace lightning_mccl
