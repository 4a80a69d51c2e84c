#include "process_group_mccl.hpp"

#include <ATen/ATen.h>

#include "arguments.hpp"
#include "errors.hpp"
#include "launch.hpp"
#include "staging.hpp"

namespace lightning_mccl {

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

}  // namespace

ProcessGroupMCCL::ProcessGroupMCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout, const std::string& route_to,
                                   const mccl::Settings& settings)
    : c10d::Backend(rank, size) {
  StoreAdapter adapter(store);
  comm_ = translated([&] {
    return std::make_unique<mccl::Communicator>(adapter, rank, size, timeout, route_to, mccl::Config::from_env(settings));
  });
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
  staging->push_back(stage(tensors[0], rank_ == root ? Access::kRead : Access::kWrite, "broadcast", rank_));
  Elements e = elements_of(tensors[0], "broadcast", rank_);
  char* data = ptr((*staging)[0]);
  return launch(c10d::OpType::BROADCAST, tensors, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->broadcast(data, e.count, e.dtype, root, std::move(done), std::move(after));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  check_one(tensors, "allreduce", rank_);
  check_dense(tensors[0], "allreduce", rank_);
  auto staging = std::make_shared<std::vector<Staged>>();
  Elements e = elements_of(tensors[0], "allreduce", rank_);
  Reduction r = reduction_of(opts.reduceOp, tensors[0], "allreduce", rank_);
  staging->push_back(stage(tensors[0], Access::kReadWrite, "allreduce", rank_, r.premul));
  char* data = ptr((*staging)[0]);
  return launch(c10d::OpType::ALLREDUCE, tensors, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->allreduce(data, e.count, e.dtype, r.op, std::move(done), std::move(after));
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
  const Access access = rank_ == root ? Access::kReadWrite : Access::kRead;  // the result lands at the root
  staging->push_back(stage(tensors[0], access, "reduce", rank_, r.premul));
  char* data = ptr((*staging)[0]);
  return launch(c10d::OpType::REDUCE, tensors, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->reduce(data, e.count, e.dtype, r.op, root, std::move(done), std::move(after));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::barrier(const c10d::BarrierOptions&) {
  auto staging = std::make_shared<std::vector<Staged>>();
  return launch(c10d::OpType::BARRIER, {}, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->barrier(std::move(done), std::move(after));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  check_one(tensors, "send", rank_);
  auto staging = std::make_shared<std::vector<Staged>>();
  Staged s = stage(tensors[0], Access::kRead, "send", rank_);
  staging->push_back(s);
  wait_copied(staging);  // a send is posted at once: its buffer must be filled first
  Elements e = elements_of(tensors[0], "send", rank_);
  return launch(c10d::OpType::SEND, tensors, staging, [&](mccl::Callback done, StartAfter) {  // copied already
    return comm_->send(ptr(s), e.count, e.dtype, dst_rank, static_cast<uint64_t>(tag), std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  check_one(tensors, "recv", rank_);
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(tensors[0], Access::kWrite, "recv", rank_));
  Elements e = elements_of(tensors[0], "recv", rank_);
  char* data = ptr((*staging)[0]);
  return launch(c10d::OpType::RECV, tensors, staging, [&](mccl::Callback done, StartAfter) {  // writes only
    return comm_->recv(data, e.count, e.dtype, src_rank, static_cast<uint64_t>(tag), std::move(done));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return recv(tensors, mccl::kAnySource, tag);
}

}  // namespace lightning_mccl
