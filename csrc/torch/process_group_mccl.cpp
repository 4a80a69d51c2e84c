#include "process_group_mccl.hpp"

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "error.h"
#include "reduce.h"
#include "staging.hpp"
#include "thread_name.h"

namespace lightning_mccl {
namespace {

// ---- errors -------------------------------------------------------------------------------------
// Bad input becomes a Python ValueError; everything else (mismatch, timeout, dead peer) a
// torch.distributed.DistBackendError, which is a RuntimeError, as NCCL raises it. torch has no timeout
// type, and its DistNetworkError (the Store's sockets) is a sibling of DistBackendError, not a kind of
// it: raising it for a dead peer would slip past every `except DistBackendError` written for NCCL.
// Tools tell a timeout from other failures by torch's phrase "Timed out" (Gloo: "Timed out waiting
// ... for recv", the Store: "Timed out after ..."), so a timeout's message carries it after our prefix:
// "MCCL timeout (Timed out): rank 0 timed out in barrier ...". A peer that closed its end reads
// "Connection closed by peer", as in Gloo (the engine's wording).
std::string torch_message(const mccl::Error& e) {
  std::string m = e.what();
  if (e.kind() != mccl::Error::Kind::kTimeout || m.find("Timed out") != std::string::npos) return m;
  size_t colon = m.find(": ");
  return colon == std::string::npos ? m + " (Timed out)" : m.insert(colon, " (Timed out)");
}

[[noreturn]] void throw_torch(const mccl::Error& e) {
  if (e.kind() == mccl::Error::Kind::kInvalidArgument) C10_THROW_ERROR(ValueError, e.what());
  C10_THROW_ERROR(DistBackendError, torch_message(e));
}

std::exception_ptr to_torch(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const mccl::Error& e) {
    try {
      throw_torch(e);
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    return std::current_exception();
  }
}

template <typename F>
auto translated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const mccl::Error& e) {
    throw_torch(e);
  }
}

#define MCCL_TORCH_CHECK(cond, ...) \
  if (!(cond)) C10_THROW_ERROR(ValueError, c10::str("MCCL invalid argument: ", __VA_ARGS__))

// ---- dtypes and ops -----------------------------------------------------------------------------
// "torch.int16", as users write it (c10's own name for it is "Short").
std::string dtype_name(const at::Tensor& t) {
  return std::string("torch.") + std::string(c10::getDtypeNames(t.scalar_type()).first);
}

struct Elements {
  mccl::DataType dtype;
  size_t count;
};

// Complex tensors travel as pairs of reals: fine for moving data and for SUM/AVG, not for the rest.
Elements elements_of(const at::Tensor& t, const char* op, int rank) {
  size_t n = static_cast<size_t>(t.numel());
  switch (t.scalar_type()) {
    case at::kFloat: return {mccl::DataType::kFloat32, n};
    case at::kDouble: return {mccl::DataType::kFloat64, n};
    case at::kHalf: return {mccl::DataType::kFloat16, n};
    case at::kBFloat16: return {mccl::DataType::kBFloat16, n};
    case at::kChar: return {mccl::DataType::kInt8, n};
    case at::kByte: return {mccl::DataType::kUInt8, n};
    case at::kInt: return {mccl::DataType::kInt32, n};
    case at::kLong: return {mccl::DataType::kInt64, n};
    case at::kBool: return {mccl::DataType::kBool, n};
    case at::kComplexFloat: return {mccl::DataType::kFloat32, 2 * n};
    case at::kComplexDouble: return {mccl::DataType::kFloat64, 2 * n};
    default:
      C10_THROW_ERROR(ValueError, c10::str("MCCL invalid argument: rank ", rank, ": ", op, " does not support dtype ",
                                           dtype_name(t),
                                           " (supported: float32, float64, float16, bfloat16, int8, uint8, int32, "
                                           "int64, bool, complex64, complex128)"));
  }
}

struct Reduction {
  mccl::ReduceOp op;
  std::optional<at::Tensor> premul;  // PREMUL_SUM: scale the input by this, then SUM
};

Reduction reduction_of(const c10d::ReduceOp& rop, const at::Tensor& t, const char* op, int rank) {
  if (rop.op_ == c10d::ReduceOp::PREMUL_SUM) {
    auto supplement = c10::static_intrusive_pointer_cast<c10d::NCCLPreMulSumSupplement>(rop.supplement_);
    at::Tensor factor = supplement->tensor_factor.defined() ? supplement->tensor_factor.to(at::kCPU)
                                                            : at::scalar_tensor(supplement->double_factor, at::kDouble);
    return {mccl::ReduceOp::kSum, factor};
  }
  struct Entry {
    c10d::ReduceOp::RedOpType from;
    mccl::ReduceOp to;
    bool complex_ok;  // complex tensors travel as real pairs: only element-wise sums make sense
  };
  static const Entry kTable[] = {
      {c10d::ReduceOp::SUM, mccl::ReduceOp::kSum, true},       {c10d::ReduceOp::AVG, mccl::ReduceOp::kAvg, true},
      {c10d::ReduceOp::PRODUCT, mccl::ReduceOp::kProduct, false}, {c10d::ReduceOp::MIN, mccl::ReduceOp::kMin, false},
      {c10d::ReduceOp::MAX, mccl::ReduceOp::kMax, false},      {c10d::ReduceOp::BAND, mccl::ReduceOp::kBand, false},
      {c10d::ReduceOp::BOR, mccl::ReduceOp::kBor, false},      {c10d::ReduceOp::BXOR, mccl::ReduceOp::kBxor, false},
  };
  for (const Entry& e : kTable) {
    if (e.from != rop.op_) continue;
    MCCL_TORCH_CHECK(e.complex_ok || !t.is_complex(), "rank ", rank, ": ", op, " does not support reduce op ",
                     mccl::op_name(e.to), " on ", dtype_name(t), " tensors");
    return {e.to, std::nullopt};
  }
  C10_THROW_ERROR(ValueError, c10::str("MCCL invalid argument: rank ", rank, ": ", op, " got an unknown reduce op (",
                                       static_cast<int>(rop.op_), ")"));
}

// ---- argument checks ----------------------------------------------------------------------------

void check_one(const std::vector<at::Tensor>& tensors, const char* op, int rank) {
  MCCL_TORCH_CHECK(tensors.size() == 1, "rank ", rank, ": ", op, " takes exactly one tensor per process, got ",
                   tensors.size());
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what, const char* op, int rank) {
  MCCL_TORCH_CHECK(a.scalar_type() == b.scalar_type(), "rank ", rank, ": ", op, ": ", what, " has dtype ",
                   dtype_name(b), " but the input is ", dtype_name(a));
  MCCL_TORCH_CHECK(a.numel() == b.numel(), "rank ", rank, ": ", op, ": ", what, " has ", b.numel(),
                   " elements but the input has ", a.numel());
}

// Runs the completion of each WorkMCCL (copy-back to the device, then the Future, whose callbacks
// run inline) off the engine's progress thread. A callback may itself issue a collective and wait
// for it, as PowerSGD's hooks do; so a blocked task never stalls the others: when no worker is idle,
// the pool starts another one (up to kMaxThreads). One pool per process, never torn down, so that a
// process group destroyed from inside a callback does not join its own thread.
class CompletionPool {
 public:
  static CompletionPool& instance() {
    static auto* pool = new CompletionPool();
    return *pool;
  }

  void post(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    // A worker that has finished its task and is coming back for the next (returning_) takes this one:
    // counting it avoids starting a thread that would only ever idle. A worker still inside a task is
    // not counted: that task may wait on this very completion.
    if (idle_ + returning_.load() == 0 && threads_ < kMaxThreads) {
      ++threads_;
      std::thread([this] {
        mccl::set_thread_name("mccl-complete");
        work();
      }).detach();
    }
    cv_.notify_one();
  }

 private:
  static constexpr int kMaxThreads = 64;

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [this] { return !tasks_.empty(); });
      --idle_;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      ++returning_;
      lock.lock();
      --returning_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  int idle_ = 0;
  std::atomic<int> returning_{0};  // finished a task, not yet back under the lock
  int threads_ = 0;
};

}  // namespace

// ---- WorkMCCL -----------------------------------------------------------------------------------

WorkMCCL::WorkMCCL(c10d::OpType type, std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout)
    : c10d::Work(-1, type), outputs_(std::move(outputs)), timeout_(timeout) {
  std::vector<c10::Device> devices;
  for (const auto& t : outputs_) {
    if (t.defined() && !t.device().is_cpu() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end())
      devices.push_back(t.device());
  }
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
}

void WorkMCCL::complete(std::exception_ptr error) {
  if (error) future_->setError(to_torch(error));
  else future_->markCompleted(c10::IValue(outputs_));
}

void WorkMCCL::set_staged(std::function<void()> copy_back, std::optional<c10::Stream> stream) {
  copy_back_ = std::move(copy_back);
  completion_stream_ = stream;
  future_wanted_ = staged_ = true;
}

bool WorkMCCL::attach(mccl::WorkPtr engine_work) {
  std::lock_guard<std::mutex> lock(mu_);
  engine_work_ = std::move(engine_work);
  attached_ = true;
  return engine_done_ && future_wanted_;
}

bool WorkMCCL::engine_finished(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mu_);
  engine_done_ = true;
  engine_error_ = error ? to_torch(error) : nullptr;
  return future_wanted_ && attached_;
}

void WorkMCCL::complete_on_pool(c10::intrusive_ptr<WorkMCCL> self) {
  CompletionPool::instance().post([self = std::move(self)] {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      error = self->engine_error_;
    }
    {
      mccl::Work::CompletionScope scope(*self->engine_work_);
      // Accelerator outputs: copied back on the staging stream, and the Future's events are recorded
      // on it, so whoever consumes the Future waits for the copy on the device, not on the host.
      c10::OptionalStreamGuard stream(self->completion_stream_);
      if (!error && self->copy_back_) {
        try {
          self->copy_back_();
        } catch (...) {
          error = std::current_exception();
        }
      }
      self->complete(error);
    }
    self->engine_work_->completion_returned();
  });
}

c10::intrusive_ptr<c10::ivalue::Future> WorkMCCL::getFuture() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool first = !future_requested_;
    future_requested_ = true;
    // Not finished yet (or staged: completed on the pool anyway): the pool completes it, and until
    // that completion returns, the collectives issued after this one wait (issue_order.h).
    if (future_wanted_ || !engine_done_) {
      future_wanted_ = true;
      if (first) engine_work_->hold_successors();
      return future_;
    }
    future_wanted_ = true;
    error = engine_error_;
  }
  // Finished before anyone asked: complete it here, on the caller's thread. It has no callbacks yet;
  // those added now run inline on this thread, in its issue order.
  complete(error);
  return future_;
}

bool WorkMCCL::isCompleted() {
  if (staged_) return future_->completed();
  std::lock_guard<std::mutex> lock(mu_);
  return engine_done_;
}

bool WorkMCCL::isSuccess() const {
  if (staged_) return future_->completed() && !future_->hasError();
  std::lock_guard<std::mutex> lock(mu_);
  return engine_done_ && !engine_error_;
}

std::exception_ptr WorkMCCL::exception() const {
  if (staged_) return future_->hasError() ? future_->exception_ptr() : nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return engine_error_;
}

int WorkMCCL::sourceRank() const { return engine_work_ ? engine_work_->source() : -1; }
std::vector<at::Tensor> WorkMCCL::result() { return outputs_; }

bool WorkMCCL::wait(std::chrono::milliseconds timeout) {
  // Every engine operation ends by itself (collectives and p2p carry the process group's timeout),
  // so without an explicit timeout this blocks until then.
  if (timeout == kNoTimeout) {
    translated([&] { engine_work_->wait(mccl::Config::global().spin_us); });
  } else if (!translated([&] { return engine_work_->wait_for(timeout); })) {
    throw_torch(mccl::Error(mccl::Error::Kind::kTimeout,
                            c10::str("MCCL timeout: ", c10d::opTypeToString(opType_), " did not complete within ",
                                     timeout.count(), " ms")));
  }
  if (staged_) {
    future_->wait();  // the completion pool finishes it right after the engine (copy-back included)
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  }
  return true;
}

// ---- ProcessGroupMCCL ---------------------------------------------------------------------------

namespace {

class StoreAdapter : public mccl::Store {
 public:
  explicit StoreAdapter(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key) override {
    try {
      auto value = store_->get(key);
      return std::string(value.begin(), value.end());
    } catch (const c10::Error& e) {
      mccl::fail(mccl::Error::Kind::kTimeout, e.what_without_backtrace());
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// Queues one engine operation for a WorkMCCL. When it ends, the completion pool copies staged outputs
// back to their devices and completes the Work's future; unstaged work completes its future lazily.
template <typename Launch>
c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, std::vector<at::Tensor> outputs, Staging staging,
                                      std::chrono::milliseconds timeout, Launch&& start) {
  auto work = c10::make_intrusive<WorkMCCL>(type, std::move(outputs), timeout);
  WorkMCCL* raw = work.get();
  c10::raw::intrusive_ptr::incref(raw);  // the engine callback owns one reference until it runs
  if (std::any_of(staging->begin(), staging->end(), [](const Staged& s) { return s.copy_back; })) {
    work->set_staged(
        [staging] {
          for (const auto& s : *staging) unstage(s);
        },
        completion_stream(staging));
  }
  mccl::Callback done = [raw, staging](std::exception_ptr error) {
    auto owned = c10::intrusive_ptr<WorkMCCL>::reclaim(raw);
    if (owned->engine_finished(error)) owned->complete_on_pool(std::move(owned));
  };
  mccl::WorkPtr engine_work;
  try {
    mccl::Communicator::StartAfter copied_out(ready(staging));  // the progress thread waits, not this one
    engine_work = start(std::move(done));
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

}  // namespace

ProcessGroupMCCL::ProcessGroupMCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout, const std::string& route_to)
    : c10d::Backend(rank, size) {
  StoreAdapter adapter(store);
  comm_ = translated([&] { return std::make_unique<mccl::Communicator>(adapter, rank, size, timeout, route_to); });
}

ProcessGroupMCCL::~ProcessGroupMCCL() = default;

void ProcessGroupMCCL::setTimeout(std::chrono::milliseconds timeout) { comm_->set_timeout(timeout); }
uint64_t ProcessGroupMCCL::getSequenceNumberForGroup() { return comm_->collectives_issued(); }
void ProcessGroupMCCL::abort() { comm_->abort(); }
void ProcessGroupMCCL::shutdown() { comm_->shutdown(); }

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast", rank_);
  const int root = static_cast<int>(opts.rootRank);
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(tensors[0], rank_ == root, rank_ != root, "broadcast", rank_));
  Elements e = elements_of(tensors[0], "broadcast", rank_);
  char* data = ptr((*staging)[0]);
  return launch(c10d::OpType::BROADCAST, tensors, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->broadcast(data, e.count, e.dtype, root, std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  check_one(tensors, "allreduce", rank_);
  check_dense(tensors[0], "allreduce", rank_);
  auto staging = std::make_shared<std::vector<Staged>>();
  Elements e = elements_of(tensors[0], "allreduce", rank_);
  Reduction r = reduction_of(opts.reduceOp, tensors[0], "allreduce", rank_);
  staging->push_back(stage(tensors[0], true, true, "allreduce", rank_, r.premul));
  char* data = ptr((*staging)[0]);
  return launch(c10d::OpType::ALLREDUCE, tensors, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->allreduce(data, e.count, e.dtype, r.op, std::move(done));
  });
}

// Coalesced: the tensors are packed into one buffer, reduced once, and unpacked.
c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  MCCL_TORCH_CHECK(!tensors.empty(), "rank ", rank_, ": allreduce_coalesced got no tensors");
  for (const auto& t : tensors) {
    check_dense(t, "allreduce_coalesced", rank_);
    MCCL_TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type() && t.device() == tensors[0].device(), "rank ", rank_,
                     ": allreduce_coalesced needs tensors of one dtype and device");
  }
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
  at::Tensor packed = at::cat(flat).to(at::kCPU).contiguous();
  Reduction r = reduction_of(opts.reduceOp, tensors[0], "allreduce_coalesced", rank_);
  if (r.premul) packed.mul_(*r.premul);
  auto staging = unpack_into(packed, tensors);
  Elements e = elements_of(packed, "allreduce_coalesced", rank_);
  char* data = static_cast<char*>(packed.data_ptr());
  return launch(c10d::OpType::ALLREDUCE_COALESCED, tensors, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->allreduce(data, e.count, e.dtype, r.op, std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce", rank_);
  check_dense(tensors[0], "reduce", rank_);
  const int root = static_cast<int>(opts.rootRank);
  auto staging = std::make_shared<std::vector<Staged>>();
  Elements e = elements_of(tensors[0], "reduce", rank_);
  Reduction r = reduction_of(opts.reduceOp, tensors[0], "reduce", rank_);
  staging->push_back(stage(tensors[0], true, rank_ == root, "reduce", rank_, r.premul));
  char* data = ptr((*staging)[0]);
  return launch(c10d::OpType::REDUCE, tensors, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->reduce(data, e.count, e.dtype, r.op, root, std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions&) {
  check_one(inputs, "allgather", rank_);
  MCCL_TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "rank ", rank_,
                   ": allgather needs one list of ", size_, " output tensors, got ",
                   outputs.size() == 1 ? outputs[0].size() : outputs.size(), outputs.size() == 1 ? "" : " lists");
  auto staging = std::make_shared<std::vector<Staged>>();
  for (const auto& out : outputs[0]) {
    check_same(inputs[0], out, "an output tensor", "allgather", rank_);
    staging->push_back(stage(out, false, true, "allgather", rank_));
  }
  Staged in = stage(inputs[0], true, false, "allgather", rank_);
  staging->push_back(in);
  Elements e = elements_of(inputs[0], "allgather", rank_);
  std::vector<char*> outs;
  for (int k = 0; k < size_; ++k) outs.push_back(ptr((*staging)[k]));
  return launch(c10d::OpType::ALLGATHER, outputs[0], staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->allgather(ptr(in), e.count, e.dtype, outs, std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions&) {
  MCCL_TORCH_CHECK(output.scalar_type() == input.scalar_type() && output.numel() == input.numel() * size_, "rank ",
                   rank_, ": all_gather_into_tensor needs an output of ", size_, " x ", input.numel(), " ",
                   dtype_name(input), " elements, got ", output.numel(), " ", dtype_name(output));
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(output, false, true, "all_gather_into_tensor", rank_));
  Staged in = stage(input, true, false, "all_gather_into_tensor", rank_);
  staging->push_back(in);
  Elements e = elements_of(input, "all_gather_into_tensor", rank_);
  size_t bytes = e.count * mccl::dtype_size(e.dtype);
  std::vector<char*> outs;
  for (int k = 0; k < size_; ++k) outs.push_back(ptr((*staging)[0]) + k * bytes);
  return launch(c10d::OpType::_ALLGATHER_BASE, {output}, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->allgather(ptr(in), e.count, e.dtype, outs, std::move(done));
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

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter", rank_);
  MCCL_TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "rank ", rank_,
                   ": reduce_scatter needs one list of ", size_, " input tensors, got ",
                   inputs.size() == 1 ? inputs[0].size() : inputs.size(), inputs.size() == 1 ? "" : " lists");
  std::vector<at::Tensor> flat;
  for (const auto& in : inputs[0]) {
    check_dense(in, "reduce_scatter", rank_);
    check_same(outputs[0], in, "an input tensor", "reduce_scatter", rank_);
    flat.push_back(in.reshape({-1}).to(at::kCPU));
  }
  at::Tensor packed = at::cat(flat).contiguous();
  return _reduce_scatter_base(outputs[0], packed, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  MCCL_TORCH_CHECK(output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * size_, "rank ",
                   rank_, ": reduce_scatter_tensor needs an input of ", size_, " x ", output.numel(), " ",
                   dtype_name(output), " elements, got ", input.numel(), " ", dtype_name(input));
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(output, false, true, "reduce_scatter", rank_));
  Reduction r = reduction_of(opts.reduceOp, output, "reduce_scatter", rank_);
  Staged in = stage(input, true, false, "reduce_scatter", rank_, r.premul);
  staging->push_back(in);
  Elements e = elements_of(output, "reduce_scatter", rank_);
  char* out = ptr((*staging)[0]);
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->reduce_scatter(ptr(in), e.count, e.dtype, r.op, out, std::move(done));
  });
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

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& output_split_sizes,
                                                               std::vector<int64_t>& input_split_sizes,
                                                               const c10d::AllToAllOptions&) {
  MCCL_TORCH_CHECK(output.scalar_type() == input.scalar_type(), "rank ", rank_, ": all_to_all_single input is ",
                   dtype_name(input), " but output is ", dtype_name(output));
  auto splits = [&](const at::Tensor& t, const std::vector<int64_t>& sizes, const char* which) {
    std::vector<size_t> counts(size_);
    int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    int64_t row_elems = rows > 0 ? t.numel() / rows : 0;
    if (sizes.empty()) {
      MCCL_TORCH_CHECK(rows % size_ == 0, "rank ", rank_, ": all_to_all_single ", which, " of ", rows,
                       " rows does not split evenly over ", size_, " ranks; pass split sizes");
      for (auto& c : counts) c = static_cast<size_t>(rows / size_ * row_elems);
    } else {
      MCCL_TORCH_CHECK(static_cast<int>(sizes.size()) == size_, "rank ", rank_, ": all_to_all_single needs ", size_,
                       " ", which, " split sizes, got ", sizes.size());
      int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
      MCCL_TORCH_CHECK(total == rows, "rank ", rank_, ": all_to_all_single ", which, " split sizes add up to ", total,
                       " rows but the tensor has ", rows);
      for (int k = 0; k < size_; ++k) counts[k] = static_cast<size_t>(sizes[k] * row_elems);
    }
    return counts;
  };
  std::vector<size_t> send_counts = splits(input, input_split_sizes, "input");
  std::vector<size_t> recv_counts = splits(output, output_split_sizes, "output");
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(output, false, true, "all_to_all_single", rank_));
  Staged in = stage(input, true, false, "all_to_all_single", rank_);
  staging->push_back(in);
  Elements e = elements_of(input, "all_to_all_single", rank_);
  size_t scale = e.count / std::max<size_t>(1, static_cast<size_t>(input.numel()));  // 2 for complex
  for (auto& c : send_counts) c *= scale;
  for (auto& c : recv_counts) c *= scale;
  char* out = ptr((*staging)[0]);
  return launch(c10d::OpType::ALLTOALL_BASE, {output}, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->alltoall(ptr(in), send_counts, out, recv_counts, e.dtype, std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions&) {
  MCCL_TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_, "rank ",
                   rank_, ": all_to_all needs ", size_, " input and output tensors, got ", inputs.size(), " and ",
                   outputs.size());
  std::vector<size_t> send_counts, recv_counts;
  std::vector<at::Tensor> flat_in;
  for (int k = 0; k < size_; ++k) {
    check_dense(inputs[k], "all_to_all", rank_);
    check_dense(outputs[k], "all_to_all", rank_);
    MCCL_TORCH_CHECK(inputs[k].scalar_type() == inputs[0].scalar_type() &&
                         outputs[k].scalar_type() == inputs[0].scalar_type(),
                     "rank ", rank_, ": all_to_all needs every tensor in one dtype");
    send_counts.push_back(elements_of(inputs[k], "all_to_all", rank_).count);
    recv_counts.push_back(elements_of(outputs[k], "all_to_all", rank_).count);
    flat_in.push_back(inputs[k].reshape({-1}).to(at::kCPU));
  }
  at::Tensor packed_in = at::cat(flat_in).contiguous();
  int64_t total_out = 0;
  for (const auto& t : outputs) total_out += t.numel();
  at::Tensor packed_out = at::empty({total_out}, inputs[0].options().device(at::kCPU));
  auto staging = unpack_into(packed_out, outputs);
  Staged keep_in;  // holds the packed input until the operation ends
  keep_in.host = packed_in;
  staging->push_back(keep_in);
  mccl::DataType dtype = elements_of(inputs[0], "all_to_all", rank_).dtype;
  return launch(c10d::OpType::ALLTOALL, outputs, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->alltoall(packed_in.data_ptr(), send_counts, packed_out.data_ptr(), recv_counts, dtype,
                           std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  check_one(inputs, "gather", rank_);
  const int root = static_cast<int>(opts.rootRank);
  auto staging = std::make_shared<std::vector<Staged>>();
  std::vector<char*> outs;
  std::vector<at::Tensor> result;
  if (rank_ == root) {
    MCCL_TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "rank ", rank_,
                     ": gather root needs one list of ", size_, " output tensors");
    for (const auto& out : outputs[0]) {
      check_same(inputs[0], out, "an output tensor", "gather", rank_);
      staging->push_back(stage(out, false, true, "gather", rank_));
      outs.push_back(ptr(staging->back()));
    }
    result = outputs[0];
  } else {
    MCCL_TORCH_CHECK(outputs.empty() || outputs[0].empty(), "rank ", rank_,
                     ": gather outputs must be empty on non-root ranks");
  }
  Staged in = stage(inputs[0], true, false, "gather", rank_);
  staging->push_back(in);
  Elements e = elements_of(inputs[0], "gather", rank_);
  return launch(c10d::OpType::GATHER, result, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->gather(ptr(in), e.count, e.dtype, outs, root, std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter", rank_);
  const int root = static_cast<int>(opts.rootRank);
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(outputs[0], false, true, "scatter", rank_));
  std::vector<const char*> ins;
  if (rank_ == root) {
    MCCL_TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "rank ", rank_,
                     ": scatter root needs one list of ", size_, " input tensors");
    for (const auto& in : inputs[0]) {
      check_same(outputs[0], in, "an input tensor", "scatter", rank_);
      staging->push_back(stage(in, true, false, "scatter", rank_));
      ins.push_back(ptr(staging->back()));
    }
  } else {
    MCCL_TORCH_CHECK(inputs.empty() || inputs[0].empty(), "rank ", rank_,
                     ": scatter inputs must be empty on non-root ranks");
  }
  Elements e = elements_of(outputs[0], "scatter", rank_);
  char* out = ptr((*staging)[0]);
  return launch(c10d::OpType::SCATTER, outputs, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->scatter(ins, out, e.count, e.dtype, root, std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::barrier(const c10d::BarrierOptions&) {
  auto staging = std::make_shared<std::vector<Staged>>();
  return launch(c10d::OpType::BARRIER, {}, staging, comm_->timeout(),
                [&](mccl::Callback done) { return comm_->barrier(std::move(done)); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  check_one(tensors, "send", rank_);
  auto staging = std::make_shared<std::vector<Staged>>();
  Staged s = stage(tensors[0], true, false, "send", rank_);
  staging->push_back(s);
  wait_copied(staging);  // a send is posted at once: its buffer must be filled first
  Elements e = elements_of(tensors[0], "send", rank_);
  return launch(c10d::OpType::SEND, tensors, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->send(ptr(s), e.count, e.dtype, dst_rank, static_cast<uint64_t>(tag), std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  check_one(tensors, "recv", rank_);
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(tensors[0], false, true, "recv", rank_));
  Elements e = elements_of(tensors[0], "recv", rank_);
  char* data = ptr((*staging)[0]);
  return launch(c10d::OpType::RECV, tensors, staging, comm_->timeout(), [&](mccl::Callback done) {
    return comm_->recv(data, e.count, e.dtype, src_rank, static_cast<uint64_t>(tag), std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return recv(tensors, mccl::kAnySource, tag);
}

}  // namespace lightning_mccl
