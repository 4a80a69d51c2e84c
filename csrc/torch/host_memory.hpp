// Whether the engine reads and writes an accelerator tensor in place, and where its bytes are for the CPU.
//
// The engine works on host memory. An accelerator tensor whose memory the CPU can address is handed to it
// as a CPU view of the same bytes, with no copy either way (staging.cpp orders it after the device work
// queued before the call); any other is copied once each way through reused host buffers. Asked at run
// time, per tensor:
//   - MPS: a buffer in shared storage mode (unified memory) has a CPU mapping (mps_memory.hpp);
//   - CUDA: memory that is pinned host memory, which the GPU reads over the bus (a CUDA tensor made over
//     a pinned allocation, e.g. torch.as_tensor of its __cuda_array_interface__): torch's isPinnedPtr.
//     Tensors from the caching allocator live in device memory and are staged.
// Only contiguous tensors go in place (the engine reads one run of bytes). PREMUL_SUM inputs are staged
// (the engine reduces a scaled copy).
//
// MCCL_DEVICE_IN_PLACE (Config::device_in_place): auto (default): in place wherever the memory allows; 0: always
// staged.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace lightning_mccl {

struct HostAccess {
  void* data = nullptr;  // the tensor's first element as the CPU sees it; nullptr: staged
  std::string reason;    // why, for mccl doctor and tests
};

// For a tensor that is not on the CPU.
HostAccess host_access(const at::Tensor& t);
// A CPU tensor over the same bytes as `t` (same sizes and strides), at `data`.
at::Tensor host_alias(const at::Tensor& t, void* data);

// How many accelerator tensors this process's collectives took in place and staged.
struct PathCounts {
  uint64_t in_place = 0;
  uint64_t staged = 0;
};
void count_path(bool in_place);
PathCounts path_counts();

}  // namespace lightning_mccl
