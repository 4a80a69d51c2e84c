// Reused host buffers for staging (staging.hpp): the copy of a tensor the engine cannot read in place.
//
// A staged tensor travels through a host buffer that goes back to a free list when the collective lets
// go of it; the next staging of the same size class takes it again, so a training step does not fault in
// (and have the OS zero) fresh pages for every bucket. CUDA tensors use torch's caching host allocator
// instead, which does the same with pinned memory. Size classes are powers of two from 16 KiB; buffers
// are 16 KiB-aligned (the page size of Apple silicon, so MPS copies can map them without a bounce).
// At most kMaxCachedHostBytes are kept free; a buffer returned beyond that is freed.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>

namespace lightning_mccl {

constexpr size_t kMaxCachedHostBytes = size_t(1) << 30;

// A contiguous CPU tensor with these sizes and options (dtype), in a reused buffer.
at::Tensor reused_host_buffer(at::IntArrayRef sizes, const at::TensorOptions& options);

struct HostBufferCounts {
  uint64_t fresh = 0;   // buffers allocated
  uint64_t reused = 0;  // buffers taken from the free list
  size_t cached_bytes = 0;
};
HostBufferCounts host_buffer_counts();

}  // namespace lightning_mccl
