// Torch arguments as the engine takes them: dtypes and element counts, reduce ops, the checks every
// collective makes on its tensors, and the packing of tensor lists into one host buffer.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <string>
#include <vector>

#include "dtype.h"

namespace lightning_mccl {

// "torch.int16", as users write it (c10's own name for it is "Short").
std::string dtype_name(const at::Tensor& t);

struct Elements {
  mccl::DataType dtype;
  size_t count;
};
// Complex tensors travel as pairs of reals: fine for moving data and for SUM/AVG, not for the rest.
Elements elements_of(const at::Tensor& t, const char* op, int rank);

struct Reduction {
  mccl::ReduceOp op;
  std::optional<at::Tensor> premul;  // PREMUL_SUM: scale the input by this, then SUM
};
Reduction reduction_of(const c10d::ReduceOp& rop, const at::Tensor& t, const char* op, int rank);

void check_one(const std::vector<at::Tensor>& tensors, const char* op, int rank);
// `b` (described as `what`) has a's dtype and element count.
void check_same(const at::Tensor& a, const at::Tensor& b, const char* what, const char* op, int rank);

// The tensors' elements, flattened and concatenated into one new contiguous CPU tensor: how a list of
// tensors (coalesced ops, reduce_scatter and all_to_all lists) travels as one engine buffer. Tensors
// on one device are concatenated there and copied to the host once. The results come back through
// staging's unpack_into.
at::Tensor pack_on_host(const std::vector<at::Tensor>& tensors);

}  // namespace lightning_mccl
