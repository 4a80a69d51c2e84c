#include "mps_memory.hpp"

#ifdef __APPLE__
#include <ATen/mps/MPSAllocatorInterface.h>
#include <c10/util/Exception.h>
#endif

namespace lightning_mccl {

#ifdef __APPLE__

bool mps_mapping_built() { return true; }

MpsMapping mps_mapping(const c10::Storage& storage) {
  // An MPS storage's data pointer is its id<MTLBuffer>, the key of the allocator's buffer table.
  const void* buffer = storage.data();
  if (buffer == nullptr) return {nullptr, "an empty MPS storage"};
  try {
    at::mps::IMPSAllocator* allocator = at::mps::getIMPSAllocator();
    if (allocator == nullptr) return {nullptr, "torch has no MPS allocator"};
    const auto cpu = allocator->getSharedBufferPtr(buffer);  // {nullptr, 0} unless shared storage
    if (cpu.first != nullptr)
      return {const_cast<void*>(cpu.first), "MPS shared storage (unified memory)"};
    if (allocator->getBufferId(buffer) == 0)
      return {nullptr, "the MPS buffer was not allocated by torch's MPS allocator"};
    return {nullptr, "torch allocated the MPS tensor in private (GPU-only) storage"};
  } catch (const c10::Error& e) {
    return {nullptr, std::string("torch's MPS allocator could not be asked: ") + e.what_without_backtrace()};
  }
}

#else

bool mps_mapping_built() { return false; }

MpsMapping mps_mapping(const c10::Storage&) {
  return {nullptr, "this build of lightning_mccl._C cannot ask torch's MPS allocator (built for macOS only)"};
}

#endif

}  // namespace lightning_mccl
