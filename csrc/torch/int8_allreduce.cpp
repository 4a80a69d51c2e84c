// ProcessGroupMCCL::allreduce_int8: the 8-bit allreduce (docs/int8.md). Two ways to the same frames, the same
// bits in the results and in the residuals:
//   - on the device (accelerator tensors): torch ops on the staging stream, after the caller's, add the residual,
//     encode (int8_codec.hpp) and leave the encoding's error in the residual; the engine gets the encoded values, a
//     quarter of the bytes to stage, and the residual of the values this rank owns, to which it adds the error of
//     their sums; when it is done the encoded result is decoded into the tensor on the staging stream.
//   - in the engine (CPU tensors): the tensor's float32 values and a CPU residual, all of the work on the
//     engine's threads (its vector code).
// allreduce_int8_encoded takes the first way's exchange with values the caller encoded (lightning_mccl.metal's
// Metal kernels on MPS), and decodes with the caller's function.
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>

#include "arguments.hpp"
#include "errors.hpp"
#include "int8_blocks.h"
#include "int8_codec.hpp"
#include "launch.hpp"
#include "staging.hpp"
#include "stream_order.hpp"

namespace lightning_mccl {
namespace {

// The checks both entries make; the engine's ReduceOp of `op`. `on_device`: the residual is on the tensor's
// device (the per-value work runs there), else on the CPU.
mccl::ReduceOp checked_int8(const at::Tensor& tensor, const at::Tensor& residual, const c10d::ReduceOp& op,
                            bool on_device, const char* name, int rank) {
  check_dense(tensor, name, rank);
  MCCL_TORCH_CHECK(tensor.scalar_type() == at::kFloat, "rank ", rank, ": ", name, " takes float32 tensors, got ",
                   dtype_name(tensor));
  MCCL_TORCH_CHECK(op.op_ == c10d::ReduceOp::SUM || op.op_ == c10d::ReduceOp::AVG, "rank ", rank, ": ", name,
                   " sums or averages (ReduceOp.SUM, ReduceOp.AVG)");
  const c10::Device work_device = on_device ? tensor.device() : c10::Device(at::kCPU);
  if (residual.defined()) {
    MCCL_TORCH_CHECK(residual.device() == work_device && residual.scalar_type() == at::kFloat &&
                         residual.is_contiguous() && residual.numel() == tensor.numel(),
                     "rank ", rank, ": ", name, "'s residual must be a contiguous float32 tensor of ", tensor.numel(),
                     " elements on ", work_device, " (where ", on_device ? "the tensor's device" : "the engine",
                     " encodes), got ", residual.numel(), " of ",
                     dtype_name(residual), " on ", residual.device());
  }
  return op.op_ == c10d::ReduceOp::AVG ? mccl::ReduceOp::kAvg : mccl::ReduceOp::kSum;
}

// The side stream that does the device's part (its encoding, the staging, the decoding), ordered after what the
// caller has queued so far (the values' producer, or their encoder), so that it overlaps the caller's next
// kernels; nullopt for CPU tensors. `used`: the caller's tensors that stream reads or writes.
std::optional<c10::Stream> side_after_caller(const c10::Device& device, std::initializer_list<at::Tensor> used) {
  if (device.is_cpu()) return std::nullopt;
  const c10::Stream side = side_stream(device);
  order_after(current_stream(device), side);
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  for (const at::Tensor& t : used)
    if (t.defined()) impl->recordDataPtrOnStream(t.storage().data_ptr(), side);
  return side;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce_int8(at::Tensor& tensor, const at::Tensor& residual,
                                                                const c10d::ReduceOp& op, bool on_device) {
  const char* name = "allreduce_int8";
  const mccl::ReduceOp reduce = checked_int8(tensor, residual, op, on_device, name, rank_);
  if (!on_device || size_ == 1) {  // one rank: nothing is encoded, the tensor stays as it is
    const size_t count = static_cast<size_t>(tensor.numel());
    auto staging = std::make_shared<std::vector<Staged>>();
    staging->push_back(stage(tensor, Access::kReadWrite, name, rank_));
    float* kept = nullptr;
    if (residual.defined() && size_ > 1) {
      staging->push_back(stage(residual, Access::kReadWrite, name, rank_));  // in place; held until the end
      kept = residual.data_ptr<float>();
    }
    float* data = reinterpret_cast<float*>(ptr((*staging)[0]));
    return launch(c10d::OpType::ALLREDUCE, {tensor}, staging, [&](mccl::Callback done, StartAfter after) {
      return comm_->allreduce_int8(data, count, reduce, kept, std::move(done), std::move(after));
    });
  }
  c10::OptionalStreamGuard on_side(side_after_caller(tensor.device(), {tensor, residual}));
  const at::Tensor values = tensor.contiguous();
  const at::Tensor blocks = int8_encode_blocks(values, residual);
  // On the stream the copies back ran on (staging.hpp), so the Future's consumers see the decoded values.
  return exchange_int8_blocks(tensor, blocks, residual, reduce, [blocks, values, tensor] {
    int8_decode_blocks(blocks, values);
    if (!values.is_same(tensor)) tensor.copy_(values);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce_int8_encoded(at::Tensor& tensor, const at::Tensor& blocks,
                                                                        const at::Tensor& residual,
                                                                        const c10d::ReduceOp& op,
                                                                        std::function<void()> decode) {
  const char* name = "allreduce_int8_encoded";
  const mccl::ReduceOp reduce = checked_int8(tensor, residual, op, true, name, rank_);
  const int64_t wire = static_cast<int64_t>(mccl::int8_wire_bytes(static_cast<size_t>(tensor.numel())));
  MCCL_TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous() && blocks.device() == tensor.device() &&
                       blocks.numel() >= wire,
                   "rank ", rank_, ": ", name, " takes the encoded values as contiguous uint8 of at least ", wire,
                   " bytes on ", tensor.device(), ", got ", blocks.numel(), " of ", dtype_name(blocks), " on ",
                   blocks.device());
  MCCL_TORCH_CHECK(size_ > 1, "rank ", rank_, ": ", name, " exchanges between ranks; a group of one rank has "
                   "nothing to exchange (allreduce_int8 leaves its tensor as it is)");
  c10::OptionalStreamGuard on_side(side_after_caller(tensor.device(), {tensor, blocks, residual}));
  return exchange_int8_blocks(tensor, blocks, residual, reduce, std::move(decode));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::exchange_int8_blocks(at::Tensor& tensor, const at::Tensor& blocks,
                                                                      const at::Tensor& residual,
                                                                      mccl::ReduceOp reduce,
                                                                      std::function<void()> finish) {
  const char* name = "allreduce_int8";
  const size_t count = static_cast<size_t>(tensor.numel());
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(int8_wire_view(blocks, tensor.numel()), Access::kReadWrite, name, rank_));
  float* owned = nullptr;
  if (residual.defined()) {
    const mccl::ValueRange own = mccl::int8_segment(count, rank_, size_);
    const at::Tensor slice = residual.view(-1).narrow(0, static_cast<int64_t>(own.first), static_cast<int64_t>(own.count));
    staging->push_back(stage(slice, Access::kReadWrite, name, rank_));
    owned = reinterpret_cast<float*>(ptr(staging->back()));
  }
  char* encoded = ptr((*staging)[0]);
  return launch(
      c10d::OpType::ALLREDUCE, {tensor}, staging,
      [&](mccl::Callback done, StartAfter after) {
        return comm_->allreduce_int8_blocks(encoded, count, reduce, owned, std::move(done), std::move(after));
      },
      std::move(finish));
}

}  // namespace lightning_mccl
