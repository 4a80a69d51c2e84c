// ProcessGroupMCCL: the `mccl` torch.distributed backend, a c10d::Backend over the MCCL engine.
//
// Tensors reach the engine as contiguous host buffers (staging.hpp: CPU tensors in place where they
// can be, accelerator tensors copied on a side stream without stalling the caller). Each operation
// returns a WorkMCCL whose Future holds the output tensors.
//
// Latency: a blocking call (dist.all_reduce without async_op) only waits, so WorkMCCL::wait() wakes
// straight from the engine's completion; the Future of unstaged work is completed only once someone
// asks for it (getFuture(): DDP's comm hooks, async_op users), which saves a thread hop per call.
// Asking for it also makes the collective a gate of the engine's completion order (issue_order.h):
// collectives that its Future's callbacks issue run before the ones issued after it.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <c10/core/Stream.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "communicator.h"

namespace lightning_mccl {

class WorkMCCL : public c10d::Work {
 public:
  WorkMCCL(c10d::OpType type, std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Set once by ProcessGroupMCCL, right after the engine operation is queued: the engine handle whose
  // completion completes this Work. True when the Future must be completed now (the engine finished
  // first and the Future is wanted): the caller then runs complete_on_pool().
  bool attach(mccl::WorkPtr engine_work);
  // Work with staged outputs completes its Future on the completion pool after `copy_back`;
  // unstaged work completes it lazily (see getFuture).
  void set_staged(std::function<void()> copy_back, std::optional<c10::Stream> stream);
  // On the progress thread when the engine operation ends: true when the Future must be completed
  // now (complete_on_pool()), false when nobody has asked for it yet or attach() has not run.
  bool engine_finished(std::exception_ptr error);
  // The completion: copy back, then the Future (its callbacks run inline, in a CompletionScope, so
  // that collectives they issue keep the engine's order), then the engine hears it has returned.
  void complete_on_pool(c10::intrusive_ptr<WorkMCCL> self);

 private:
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  void complete(std::exception_ptr error);

  mccl::WorkPtr engine_work_;
  std::function<void()> copy_back_;
  std::optional<c10::Stream> completion_stream_;  // accelerator outputs: the staging stream
  mutable std::mutex mu_;        // the flags below, engine_error_, engine_work_
  bool staged_ = false;
  bool future_wanted_ = false;   // the Future is completed as soon as the engine is done
  bool future_requested_ = false;  // getFuture() has been called
  bool attached_ = false;
  bool engine_done_ = false;
  std::exception_ptr engine_error_;  // already translated to a torch exception
};

class ProcessGroupMCCL : public c10d::Backend {
 public:
  ProcessGroupMCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout, const std::string& route_to);
  ~ProcessGroupMCCL() override;

  const std::string getBackendName() const override { return "mccl"; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  uint64_t getSequenceNumberForGroup() override;
  void abort() override;
  void shutdown() override;
  const std::string& listenAddress() const { return comm_->listen_address(); }
  mccl::CommStats::Snapshot stats() const { return comm_->stats(); }

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

 private:
  std::unique_ptr<mccl::Communicator> comm_;
};

}  // namespace lightning_mccl
