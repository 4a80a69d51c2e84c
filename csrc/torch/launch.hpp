// ProcessGroupMCCL::launch, included by the files that implement the operations.
#pragma once

#include <algorithm>
#include <functional>

#include "errors.hpp"
#include "process_group_mccl.hpp"
#include "staging.hpp"

namespace lightning_mccl {

// Queues one engine operation for a WorkMCCL. When it ends, the completion pool copies staged outputs
// back to their devices, runs `finish`, and completes the Work's future; other work completes its future lazily.
template <typename Start>
c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::launch(c10d::OpType type, std::vector<at::Tensor> outputs,
                                                        Staging staging, Start&& start, std::function<void()> finish) {
  auto work = c10::make_intrusive<WorkMCCL>(type, std::move(outputs));
  WorkMCCL* raw = work.get();
  c10::raw::intrusive_ptr::incref(raw);  // the engine callback owns one reference until it runs
  if (finish || std::any_of(staging->begin(), staging->end(), [](const Staged& s) { return s.copy_back; })) {
    work->set_staged(
        [staging, finish = std::move(finish)] {
          for (const auto& s : *staging) unstage(s);
          if (finish) finish();
        },
        completion_stream(staging));
  }
  mccl::Callback done = [raw, staging](std::exception_ptr error) {
    auto owned = c10::intrusive_ptr<WorkMCCL>::reclaim(raw);
    if (owned->engine_finished(error)) owned->complete_on_pool(std::move(owned));
  };
  mccl::WorkPtr engine_work;
  try {
    engine_work = start(std::move(done), ready(staging));  // the progress thread waits for the copies, not this one
  } catch (const mccl::Error& e) {
    c10::intrusive_ptr<WorkMCCL>::reclaim(raw);  // the callback never runs
    throw_torch(e);
  } catch (...) {
    c10::intrusive_ptr<WorkMCCL>::reclaim(raw);
    throw;
  }
  if (work->attach(std::move(engine_work))) work->complete_on_pool(work);  // it finished first
  return work;
}

}  // namespace lightning_mccl
