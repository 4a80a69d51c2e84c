// The coalesced variants: allreduce_coalesced packs its tensors into one buffer (one allreduce); the
// others issue one collective per tensor, which complete in issue order.
#include "process_group_mccl.hpp"

#include <ATen/ATen.h>

#include "arguments.hpp"
#include "errors.hpp"
#include "launch.hpp"
#include "staging.hpp"

namespace lightning_mccl {

// Coalesced: the tensors are packed into one buffer, reduced once, and unpacked.
c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  MCCL_TORCH_CHECK(!tensors.empty(), "rank ", rank_, ": allreduce_coalesced got no tensors");
  for (const auto& t : tensors) {
    check_dense(t, "allreduce_coalesced", rank_);
    MCCL_TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type() && t.device() == tensors[0].device(), "rank ", rank_,
                     ": allreduce_coalesced needs tensors of one dtype and device");
  }
  at::Tensor packed = pack_on_host(tensors);
  Reduction r = reduction_of(opts.reduceOp, tensors[0], "allreduce_coalesced", rank_);
  if (r.premul) packed.mul_(*r.premul);
  auto staging = unpack_into(packed, tensors);
  Elements e = elements_of(packed, "allreduce_coalesced", rank_);
  char* data = static_cast<char*>(packed.data_ptr());
  return launch(c10d::OpType::ALLREDUCE_COALESCED, tensors, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->allreduce(data, e.count, e.dtype, r.op, std::move(done), std::move(after));
  });
}

// torch's layout (distributed_c10d.all_gather_coalesced, as Gloo reads it): outputs[r][i] receives rank r's
// inputs[i], so there are world-size output lists of inputs.size() tensors each. One allgather per input.
c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                     std::vector<at::Tensor>& inputs,
                                                                     const c10d::AllgatherOptions& opts) {
  MCCL_TORCH_CHECK(!inputs.empty(), "rank ", rank_, ": allgather_coalesced got no input tensors");
  MCCL_TORCH_CHECK(static_cast<int>(outputs.size()) == size_, "rank ", rank_, ": allgather_coalesced needs ", size_,
                   " output lists (one per rank), got ", outputs.size());
  for (size_t r = 0; r < outputs.size(); ++r) {
    MCCL_TORCH_CHECK(outputs[r].size() == inputs.size(), "rank ", rank_, ": allgather_coalesced output list ", r,
                     " has ", outputs[r].size(), " tensors for ", inputs.size(), " inputs");
  }
  c10::intrusive_ptr<c10d::Work> last;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> out(1);
    for (auto& list : outputs) out[0].push_back(list[i]);
    std::vector<at::Tensor> in{inputs[i]};
    last = allgather(out, in, opts);
  }
  return last;  // collectives complete in issue order: the last one done means all are
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const c10d::AllgatherOptions& opts) {
  MCCL_TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(), "rank ", rank_,
                   ": allgather_into_tensor_coalesced needs as many outputs as inputs (got ", outputs.size(), " and ",
                   inputs.size(), ")");
  c10::intrusive_ptr<c10d::Work> last;
  for (size_t i = 0; i < inputs.size(); ++i) last = _allgather_base(outputs[i], inputs[i], opts);
  return last;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  MCCL_TORCH_CHECK(outputs.size() == inputs.size() && !inputs.empty(), "rank ", rank_,
                   ": reduce_scatter_tensor_coalesced needs as many outputs as inputs (got ", outputs.size(), " and ",
                   inputs.size(), ")");
  c10::intrusive_ptr<c10d::Work> last;
  for (size_t i = 0; i < inputs.size(); ++i) last = _reduce_scatter_base(outputs[i], inputs[i], opts);
  return last;
}

}  // namespace lightning_mccl
