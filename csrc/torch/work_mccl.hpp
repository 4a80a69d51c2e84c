// WorkMCCL: the c10d::Work of one MCCL operation, completed by the engine's completion.
//
// Latency: a blocking call (dist.all_reduce without async_op) only waits, so WorkMCCL::wait() wakes
// straight from the engine's completion; the Future of unstaged work is completed only once someone
// asks for it (getFuture(): DDP's comm hooks, async_op users), which saves a thread hop per call.
// Asking for it also makes the collective a gate of the engine's completion order (issue_order.h):
// collectives that its Future's callbacks issue run before the ones issued after it.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <c10/core/Stream.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "work.h"

namespace lightning_mccl {

class WorkMCCL : public c10d::Work {
 public:
  // wait() spins before it sleeps as the engine work's policy says (the group's MCCL_SPIN_US: mccl::Work::wait).
  WorkMCCL(c10d::OpType type, std::vector<at::Tensor> outputs);

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

}  // namespace lightning_mccl
