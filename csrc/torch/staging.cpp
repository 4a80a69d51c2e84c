#include "staging.hpp"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "host_buffers.hpp"
#include "host_memory.hpp"

namespace lightning_mccl {
namespace {

// PREMUL_SUM: the values the engine reduces (in the tensor's own dtype, as an in-place multiply would).
at::Tensor scaled(const at::Tensor& t, const at::Tensor& premul) {
  return t.clone(at::MemoryFormat::Contiguous).mul_(premul);
}

// The host buffer a staged tensor travels through: pinned for CUDA (torch's caching host allocator,
// which reuses them), else from our own reused buffers (host_buffers.hpp).
at::Tensor host_buffer(const at::Tensor& t) {
  if (t.device().is_cuda()) return at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  return reused_host_buffer(t.sizes(), t.options());
}

}  // namespace

void check_dense(const at::Tensor& t, const char* op, int rank) {
  TORCH_CHECK_VALUE(t.defined(), "MCCL invalid argument: rank ", rank, ": ", op, " got an undefined tensor");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "MCCL invalid argument: rank ", rank, ": ", op,
                    " does not support ", t.layout(), " tensors (sparse tensors: densify them first)");
}

Staged stage(const at::Tensor& t, Access access, const char* op, int rank, const std::optional<at::Tensor>& premul) {
  check_dense(t, op, rank);
  const bool read = access != Access::kWrite, write = access != Access::kRead;
  Staged s;
  s.user = t;
  if (t.device().is_cpu()) {
    s.host = t.is_contiguous() ? t : host_buffer(t);
    if (read && !s.host.is_same(t)) s.host.copy_(t);
    if (read && premul) s.host = scaled(s.host, *premul);  // a new tensor: the result is copied back
    s.copy_back = write && !s.host.is_same(t);
    return s;
  }
  const c10::Device device = t.device();
  const c10::Stream caller = current_stream(device);
  if (!(read && premul)) {
    const HostAccess access = host_access(t);
    count_path(access.data != nullptr);
    if (access.data) {
      s.host = host_alias(t, access.data);
      s.start_after = mark(caller);
      return s;
    }
  } else {
    count_path(false);
  }
  const c10::Stream side = side_stream(device);
  s.stream = side;
  s.copy_back = write;
  s.host = host_buffer(t);
  // The side stream starts after what the caller has queued so far (including the premul and the
  // contiguous copy, which run on the caller's stream).
  s.source = read ? (premul ? scaled(t, *premul) : t.contiguous()) : at::Tensor();
  order_after(caller, side);
  if (read) {
    c10::StreamGuard guard(side);
    s.host.copy_(s.source, /*non_blocking=*/true);
    c10::impl::getDeviceGuardImpl(device.type())->recordDataPtrOnStream(s.source.storage().data_ptr(), side);
    s.start_after = mark(side);
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
    if (!t.device().is_cpu()) s.stream = current_stream(t.device());
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
  std::vector<Mark> marks;
  for (const auto& s : *staging)
    if (s.start_after) marks.push_back(s.start_after);
  return host_wait(std::move(marks));
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
