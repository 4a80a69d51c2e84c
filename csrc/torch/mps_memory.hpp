// Where an MPS tensor's memory is for the CPU. Apple silicon has unified memory: a Metal buffer in shared
// storage mode has a CPU mapping of the same bytes, one in private storage mode has none. Which one
// torch's MPS allocator hands out depends on the release (older ones keep tensors private, newer ones
// allocate every pool shared), so it is asked at run time, for each buffer.
//
// Mac-only, behind __APPLE__: elsewhere (and whenever the allocator cannot answer) the answer is "no
// CPU mapping", and the tensor is staged through host buffers.
#pragma once

#include <c10/core/Storage.h>

#include <string>

namespace lightning_mccl {

struct MpsMapping {
  void* base = nullptr;  // CPU address of the storage's first byte; nullptr: none
  std::string reason;    // why (or why not), for mccl doctor
};

MpsMapping mps_mapping(const c10::Storage& storage);
// Whether this build can ask torch's MPS allocator at all (built for macOS).
bool mps_mapping_built();

}  // namespace lightning_mccl
