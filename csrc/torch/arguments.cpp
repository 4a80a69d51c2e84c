#include "arguments.hpp"

#include <torch/csrc/distributed/c10d/Types.hpp>

#include "errors.hpp"

namespace lightning_mccl {

std::string dtype_name(const at::Tensor& t) {
  return std::string("torch.") + std::string(c10::getDtypeNames(t.scalar_type()).first);
}

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

at::Tensor pack_on_host(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  bool one_device = true;
  for (const auto& t : tensors) {
    flat.push_back(t.reshape({-1}));
    one_device = one_device && t.device() == tensors[0].device();
  }
  if (!one_device)
    for (auto& f : flat) f = f.to(at::kCPU);
  return at::cat(flat).to(at::kCPU).contiguous();  // cat always makes a new tensor: nothing aliases the inputs
}

}  // namespace lightning_mccl
