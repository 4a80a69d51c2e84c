// ProcessGroupMCCL: the `mccl` torch.distributed backend, a c10d::Backend over the MCCL engine.
//
// Tensors reach the engine as contiguous host buffers (staging.hpp: CPU tensors in place where they
// can be, accelerator tensors copied on a side stream without stalling the caller). Each operation
// returns a WorkMCCL (work_mccl.hpp) whose Future holds the output tensors. The operations live in
// files named for what they hold: process_group_mccl.cpp (the group, broadcast, allreduce, reduce,
// barrier, point-to-point), gather_scatter.cpp (allgather, reduce-scatter, all-to-all, gather,
// scatter), coalesced.cpp (the coalesced variants), int8_allreduce.cpp (the 8-bit allreduce); launch.hpp
// queues them on the engine.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "communicator.h"
#include "work_mccl.hpp"

namespace lightning_mccl {

struct Staged;  // staging.hpp
using Staging = std::shared_ptr<std::vector<Staged>>;
using StartAfter = mccl::Communicator::StartAfter;

class ProcessGroupMCCL : public c10d::Backend {
 public:
  // `settings`: the group's backend options (variable name -> value, docs/settings.md), which take the
  // place of the environment's values. The group reads its settings here, once: nothing changes them
  // later, and a variable set afterwards applies to the groups made after that.
  ProcessGroupMCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout, const std::string& route_to,
                   const mccl::Settings& settings = {});
  ~ProcessGroupMCCL() override;

  const std::string getBackendName() const override { return "mccl"; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  uint64_t getSequenceNumberForGroup() override;
  void abort() override;
  void shutdown() override;
  const std::string& listenAddress() const { return comm_->listen_address(); }
  mccl::CommStats::Snapshot stats() const { return comm_->stats(); }
  std::vector<mccl::TimelineEntry> timeline() const { return comm_->timeline(); }
  // The settings this group read when it was made (its pg_options over the environment), kept unchanged.
  const mccl::Config& config() const { return comm_->config(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // The 8-bit allreduce with error feedback (docs/int8.md): `tensor` float32 on any device, `op` SUM or AVG,
  // `residual` an undefined tensor or a contiguous float32 tensor of as many elements, kept by the caller between
  // calls, where the per-value work runs. `on_device`: this rank's per-value work (the residual, encoding,
  // decoding) runs in torch ops on the tensor's device (int8_codec.hpp), which hands the engine the encoded
  // values (Communicator::allreduce_int8_blocks); else the engine does it (Communicator::allreduce_int8) on the
  // tensor staged as float32, and the residual is a CPU tensor.
  c10::intrusive_ptr<c10d::Work> allreduce_int8(at::Tensor& tensor, const at::Tensor& residual,
                                                const c10d::ReduceOp& op, bool on_device);
  // The same for values the caller encoded on their device (lightning_mccl.metal's kernels, queued on the current
  // stream): `blocks` (uint8, int8_codec.hpp's layout) holds tensor.numel() values with the residual added, and
  // `residual` (as above, on the tensor's device) what that encoding lost. The engine exchanges the blocks and
  // leaves the reduced ones in `blocks`, adding the error of the sums this rank owns to its part of `residual`;
  // then `decode` (which writes the result into `tensor`) runs on the completion pool before the Work's future
  // completes. At least two ranks (with one, allreduce_int8 leaves the tensor as it is).
  c10::intrusive_ptr<c10d::Work> allreduce_int8_encoded(at::Tensor& tensor, const at::Tensor& blocks,
                                                        const at::Tensor& residual, const c10d::ReduceOp& op,
                                                        std::function<void()> decode);
  // Where this group runs the per-value work of accelerator tensors (the 8-bit path's, DiLoCo's): "metal", or
  // why torch ops do it; set once, when the group is made, by what its ranks agreed (lightning_mccl.metal).
  const std::string& device_kernels() const { return device_kernels_; }
  void set_device_kernels(std::string choice) { device_kernels_ = std::move(choice); }

 private:
  // The exchange of `blocks` (of tensor's values, encoded on the device, on the current stream), then `finish`.
  c10::intrusive_ptr<c10d::Work> exchange_int8_blocks(at::Tensor& tensor, const at::Tensor& blocks,
                                                      const at::Tensor& residual, mccl::ReduceOp reduce,
                                                      std::function<void()> finish);
  // Queues one engine operation (`start(done, start_after)`) for a new WorkMCCL (launch.hpp). `finish` (may be
  // empty): runs on the completion pool after the staged outputs are copied back, on their stream.
  template <typename Start>
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, std::vector<at::Tensor> outputs, Staging staging,
                                        Start&& start, std::function<void()> finish = nullptr);

  std::unique_ptr<mccl::Communicator> comm_;
  std::string device_kernels_;
};

}  // namespace lightning_mccl
