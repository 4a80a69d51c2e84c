#include "host_memory.hpp"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <atomic>

#include "config.h"
#include "errors.hpp"
#include "mps_memory.hpp"

namespace lightning_mccl {
namespace {

std::atomic<uint64_t> in_place_count{0};
std::atomic<uint64_t> staged_count{0};

// MCCL_DEVICE_IN_PLACE, read once per process, at the first tensor that gets this far (a bad value is a
// ValueError then, and is read again at the next).
bool in_place_enabled() {
  static const bool enabled = translated([] { return mccl::Config::process().device_in_place; });
  return enabled;
}

HostAccess cuda_access(const at::Tensor& t) {
  void* data = t.data_ptr();
  at::globalContext().lazyInitDevice(at::kCUDA);  // isPinnedPtr says false before (a no-op after)
  if (at::globalContext().isPinnedPtr(data, at::kCUDA)) return {data, "pinned host memory"};
  return {nullptr, "device memory"};
}

HostAccess mps_access(const at::Tensor& t) {
  MpsMapping m = mps_mapping(t.storage());
  if (m.base == nullptr) return {nullptr, m.reason};
  return {static_cast<char*>(m.base) + t.storage_offset() * t.element_size(), m.reason};
}

}  // namespace

HostAccess host_access(const at::Tensor& t) {
  if (t.numel() == 0) return {nullptr, "an empty tensor"};
  if (!t.is_contiguous()) return {nullptr, "not contiguous"};
  if (!in_place_enabled()) return {nullptr, "MCCL_DEVICE_IN_PLACE=0"};
  if (t.device().is_cuda()) return cuda_access(t);
  if (t.device().is_mps()) return mps_access(t);
  return {nullptr, c10::str("no CPU mapping is known for ", t.device().type(), " memory")};
}

at::Tensor host_alias(const at::Tensor& t, void* data) {
  return at::from_blob(data, t.sizes(), t.strides(), t.options().device(at::kCPU));
}

void count_path(bool in_place) { (in_place ? in_place_count : staged_count).fetch_add(1, std::memory_order_relaxed); }

PathCounts path_counts() {
  return {in_place_count.load(std::memory_order_relaxed), staged_count.load(std::memory_order_relaxed)};
}

}  // namespace lightning_mccl
