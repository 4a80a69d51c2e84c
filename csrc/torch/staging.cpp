#include "staging.hpp"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <map>
#include <mutex>

namespace lightning_mccl {
namespace {

// One side stream per device, taken from the device's stream pool once: every staging copy of that
// device is ordered on it.
c10::Stream side_stream(const c10::Device& device) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, c10::Stream> streams;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(static_cast<int>(device.type()), static_cast<int>(device.index()));
  auto it = streams.find(key);
  if (it != streams.end()) return it->second;
  auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  c10::Stream stream = impl->getStream(device);
  try {
    stream = impl->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  } catch (const c10::Error&) {
    // A device without a stream pool: stage on the caller's stream (still ordered, not overlapped).
  }
  streams.emplace(key, stream);
  return stream;
}

// PREMUL_SUM: the values the engine reduces (in the tensor's own dtype, as an in-place multiply would).
at::Tensor scaled(const at::Tensor& t, const at::Tensor& premul) {
  return t.clone(at::MemoryFormat::Contiguous).mul_(premul);
}

at::TensorOptions host_options(const at::Tensor& t) {
  return t.options().device(at::kCPU).pinned_memory(t.device().is_cuda());
}

}  // namespace

void check_dense(const at::Tensor& t, const char* op, int rank) {
  TORCH_CHECK_VALUE(t.defined(), "MCCL invalid argument: rank ", rank, ": ", op, " got an undefined tensor");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "MCCL invalid argument: rank ", rank, ": ", op,
                    " does not support ", t.layout(), " tensors (sparse tensors: densify them first)");
}

Staged stage(const at::Tensor& t, bool read, bool write, const char* op, int rank,
             const std::optional<at::Tensor>& premul) {
  check_dense(t, op, rank);
  Staged s;
  s.user = t;
  if (t.device().is_cpu()) {
    s.host = t.is_contiguous() ? t : t.contiguous();
    if (read && premul) s.host = scaled(s.host, *premul);  // a new tensor: the result is copied back
    s.copy_back = write && !s.host.is_same(t);
    return s;
  }
  const c10::Device device = t.device();
  auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  const c10::Stream caller = impl->getStream(device);
  const c10::Stream side = side_stream(device);
  s.stream = side;
  s.copy_back = write;
  s.host = at::empty(t.sizes(), host_options(t));
  // The side stream starts after what the caller has queued so far (including the premul and the
  // contiguous copy, which run on the caller's stream).
  s.source = read ? (premul ? scaled(t, *premul) : t.contiguous()) : at::Tensor();
  c10::Event produced(device.type());
  produced.record(caller);
  produced.block(side);
  if (read) {
    c10::StreamGuard guard(side);
    s.host.copy_(s.source, /*non_blocking=*/true);
    impl->recordDataPtrOnStream(s.source.storage().data_ptr(), side);
    s.copied = std::make_shared<c10::Event>(device.type());
    s.copied->record(side);
  }
  return s;
}

Staging unpack_into(const at::Tensor& packed, const std::vector<at::Tensor>& tensors) {
  auto staging = std::make_shared<std::vector<Staged>>();
  int64_t at_elem = 0;
  for (const auto& t : tensors) {
    Staged s;
    s.user = t;
    s.host = packed.narrow(0, at_elem, t.numel()).view(t.sizes());
    s.copy_back = true;
    if (!t.device().is_cpu()) s.stream = c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device());
    staging->push_back(s);
    at_elem += t.numel();
  }
  return staging;
}

void unstage(const Staged& s) {
  if (!s.copy_back) return;
  if (!s.stream) {
    s.user.copy_(s.host);
    return;
  }
  c10::StreamGuard guard(*s.stream);
  s.user.copy_(s.host, /*non_blocking=*/s.host.is_pinned());
  c10::impl::getDeviceGuardImpl(s.user.device().type())->recordDataPtrOnStream(s.user.storage().data_ptr(),
                                                                               *s.stream);
}

std::function<void()> ready(const Staging& staging) {
  std::vector<std::shared_ptr<c10::Event>> events;
  for (const auto& s : *staging)
    if (s.copied) events.push_back(s.copied);
  if (events.empty()) return nullptr;
  return [events = std::move(events)] {
    for (const auto& e : events) e->synchronize();
  };
}

void wait_copied(const Staging& staging) {
  if (auto wait = ready(staging)) wait();
}

std::optional<c10::Stream> completion_stream(const Staging& staging) {
  for (const auto& s : *staging)
    if (s.copy_back && s.stream) return s.stream;
  return std::nullopt;
}

}  // namespace lightning_mccl
