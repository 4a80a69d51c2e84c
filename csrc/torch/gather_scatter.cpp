// allgather, reduce-scatter, all-to-all, gather and scatter: the collectives whose inputs and outputs
// differ in size or number.
#include "process_group_mccl.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "arguments.hpp"
#include "errors.hpp"
#include "launch.hpp"
#include "staging.hpp"

namespace lightning_mccl {

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
    staging->push_back(stage(out, Access::kWrite, "allgather", rank_));
  }
  Staged in = stage(inputs[0], Access::kRead, "allgather", rank_);
  staging->push_back(in);
  Elements e = elements_of(inputs[0], "allgather", rank_);
  std::vector<char*> outs;
  for (int k = 0; k < size_; ++k) outs.push_back(ptr((*staging)[k]));
  return launch(c10d::OpType::ALLGATHER, outputs[0], staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->allgather(ptr(in), e.count, e.dtype, outs, std::move(done), std::move(after));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions&) {
  MCCL_TORCH_CHECK(output.scalar_type() == input.scalar_type() && output.numel() == input.numel() * size_, "rank ",
                   rank_, ": all_gather_into_tensor needs an output of ", size_, " x ", input.numel(), " ",
                   dtype_name(input), " elements, got ", output.numel(), " ", dtype_name(output));
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(output, Access::kWrite, "all_gather_into_tensor", rank_));
  Staged in = stage(input, Access::kRead, "all_gather_into_tensor", rank_);
  staging->push_back(in);
  Elements e = elements_of(input, "all_gather_into_tensor", rank_);
  size_t bytes = e.count * mccl::dtype_size(e.dtype);
  std::vector<char*> outs;
  for (int k = 0; k < size_; ++k) outs.push_back(ptr((*staging)[0]) + k * bytes);
  return launch(c10d::OpType::_ALLGATHER_BASE, {output}, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->allgather(ptr(in), e.count, e.dtype, outs, std::move(done), std::move(after));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter", rank_);
  MCCL_TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "rank ", rank_,
                   ": reduce_scatter needs one list of ", size_, " input tensors, got ",
                   inputs.size() == 1 ? inputs[0].size() : inputs.size(), inputs.size() == 1 ? "" : " lists");
  for (const auto& in : inputs[0]) {
    check_dense(in, "reduce_scatter", rank_);
    check_same(outputs[0], in, "an input tensor", "reduce_scatter", rank_);
  }
  at::Tensor packed = pack_on_host(inputs[0]);
  return _reduce_scatter_base(outputs[0], packed, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  MCCL_TORCH_CHECK(output.scalar_type() == input.scalar_type() && input.numel() == output.numel() * size_, "rank ",
                   rank_, ": reduce_scatter_tensor needs an input of ", size_, " x ", output.numel(), " ",
                   dtype_name(output), " elements, got ", input.numel(), " ", dtype_name(input));
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(output, Access::kWrite, "reduce_scatter", rank_));
  Reduction r = reduction_of(opts.reduceOp, output, "reduce_scatter", rank_);
  Staged in = stage(input, Access::kRead, "reduce_scatter", rank_, r.premul);
  staging->push_back(in);
  Elements e = elements_of(output, "reduce_scatter", rank_);
  char* out = ptr((*staging)[0]);
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->reduce_scatter(ptr(in), e.count, e.dtype, r.op, out, std::move(done), std::move(after));
  });
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
  staging->push_back(stage(output, Access::kWrite, "all_to_all_single", rank_));
  Staged in = stage(input, Access::kRead, "all_to_all_single", rank_);
  staging->push_back(in);
  Elements e = elements_of(input, "all_to_all_single", rank_);
  size_t scale = e.count / std::max<size_t>(1, static_cast<size_t>(input.numel()));  // 2 for complex
  for (auto& c : send_counts) c *= scale;
  for (auto& c : recv_counts) c *= scale;
  char* out = ptr((*staging)[0]);
  return launch(c10d::OpType::ALLTOALL_BASE, {output}, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->alltoall(ptr(in), send_counts, out, recv_counts, e.dtype, std::move(done), std::move(after));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions&) {
  MCCL_TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_, "rank ",
                   rank_, ": all_to_all needs ", size_, " input and output tensors, got ", inputs.size(), " and ",
                   outputs.size());
  std::vector<size_t> send_counts, recv_counts;
  for (int k = 0; k < size_; ++k) {
    check_dense(inputs[k], "all_to_all", rank_);
    check_dense(outputs[k], "all_to_all", rank_);
    MCCL_TORCH_CHECK(inputs[k].scalar_type() == inputs[0].scalar_type() &&
                         outputs[k].scalar_type() == inputs[0].scalar_type(),
                     "rank ", rank_, ": all_to_all needs every tensor in one dtype");
    send_counts.push_back(elements_of(inputs[k], "all_to_all", rank_).count);
    recv_counts.push_back(elements_of(outputs[k], "all_to_all", rank_).count);
  }
  at::Tensor packed_in = pack_on_host(inputs);
  int64_t total_out = 0;
  for (const auto& t : outputs) total_out += t.numel();
  at::Tensor packed_out = at::empty({total_out}, inputs[0].options().device(at::kCPU));
  auto staging = unpack_into(packed_out, outputs);
  Staged keep_in;  // holds the packed input until the operation ends
  keep_in.host = packed_in;
  staging->push_back(keep_in);
  mccl::DataType dtype = elements_of(inputs[0], "all_to_all", rank_).dtype;
  return launch(c10d::OpType::ALLTOALL, outputs, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->alltoall(packed_in.data_ptr(), send_counts, packed_out.data_ptr(), recv_counts, dtype,
                           std::move(done), std::move(after));
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
      staging->push_back(stage(out, Access::kWrite, "gather", rank_));
      outs.push_back(ptr(staging->back()));
    }
    result = outputs[0];
  } else {
    MCCL_TORCH_CHECK(outputs.empty() || outputs[0].empty(), "rank ", rank_,
                     ": gather outputs must be empty on non-root ranks");
  }
  Staged in = stage(inputs[0], Access::kRead, "gather", rank_);
  staging->push_back(in);
  Elements e = elements_of(inputs[0], "gather", rank_);
  return launch(c10d::OpType::GATHER, result, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->gather(ptr(in), e.count, e.dtype, outs, root, std::move(done), std::move(after));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMCCL::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter", rank_);
  const int root = static_cast<int>(opts.rootRank);
  auto staging = std::make_shared<std::vector<Staged>>();
  staging->push_back(stage(outputs[0], Access::kWrite, "scatter", rank_));
  std::vector<const char*> ins;
  if (rank_ == root) {
    MCCL_TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "rank ", rank_,
                     ": scatter root needs one list of ", size_, " input tensors");
    for (const auto& in : inputs[0]) {
      check_same(outputs[0], in, "an input tensor", "scatter", rank_);
      staging->push_back(stage(in, Access::kRead, "scatter", rank_));
      ins.push_back(ptr(staging->back()));
    }
  } else {
    MCCL_TORCH_CHECK(inputs.empty() || inputs[0].empty(), "rank ", rank_,
                     ": scatter inputs must be empty on non-root ranks");
  }
  Elements e = elements_of(outputs[0], "scatter", rank_);
  char* out = ptr((*staging)[0]);
  return launch(c10d::OpType::SCATTER, outputs, staging, [&](mccl::Callback done, StartAfter after) {
    return comm_->scatter(ins, out, e.count, e.dtype, root, std::move(done), std::move(after));
  });
}

}  // namespace lightning_mccl
