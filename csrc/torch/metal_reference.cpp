#include "metal_reference.hpp"

#include <initializer_list>

#include "arithmetic.h"

namespace lightning_mccl::metal_reference {
namespace {

// Contiguous CPU tensors of `dtype` with at least `count` elements each.
void check(std::initializer_list<const at::Tensor*> tensors, at::ScalarType dtype, int64_t count, const char* kernel) {
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK_VALUE(t->device().is_cpu() && t->is_contiguous() && t->scalar_type() == dtype && t->numel() >= count,
                      "metal_reference.", kernel, ": contiguous CPU tensors of ", dtype, " with at least ", count,
                      " elements, got ", t->numel(), " of ", t->scalar_type(), " on ", t->device());
  }
}

int64_t rows(int64_t count) { return (count + mccl_arith::kBlock - 1) / mccl_arith::kBlock; }

}  // namespace

void int8_encode(const at::Tensor& values, const at::Tensor& residual, const at::Tensor& blocks, int64_t count,
                 int64_t feedback) {
  check({&values, &residual}, at::kFloat, count, "int8_encode");
  check({&blocks}, at::kByte, rows(count) * mccl_arith::kRow, "int8_encode");
  mccl_arith::encode_on_cpu(values.data_ptr<float>(), feedback ? residual.data_ptr<float>() : nullptr,
                            blocks.data_ptr<uint8_t>(), static_cast<size_t>(count));
}

void int8_decode(const at::Tensor& blocks, const at::Tensor& out, int64_t add) {
  check({&out}, at::kFloat, 0, "int8_decode");
  check({&blocks}, at::kByte, rows(out.numel()) * mccl_arith::kRow, "int8_decode");
  mccl_arith::decode_on_cpu(blocks.data_ptr<uint8_t>(), out.data_ptr<float>(), static_cast<size_t>(out.numel()),
                            add != 0);
}

void pseudo_gradient(const at::Tensor& anchor, const at::Tensor& flat, const at::Tensor& own) {
  check({&anchor, &flat, &own}, at::kFloat, flat.numel(), "pseudo_gradient");
  const float* a = anchor.data_ptr<float>();
  float* w = flat.data_ptr<float>();
  float* o = own.data_ptr<float>();
  for (int64_t i = 0; i < flat.numel(); ++i) o[i] = w[i] = mccl_arith::diloco_pseudo_gradient(a[i], w[i]);
}

void outer_step(const at::Tensor& mean, const at::Tensor& momentum, const at::Tensor& anchor, const at::Tensor& own,
                double lr, double mu) {
  check({&mean, &momentum, &anchor, &own}, at::kFloat, own.numel(), "outer_step");
  const float* d = mean.data_ptr<float>();
  float *m = momentum.data_ptr<float>(), *a = anchor.data_ptr<float>(), *o = own.data_ptr<float>();
  for (int64_t i = 0; i < own.numel(); ++i)
    mccl_arith::diloco_outer_step(d[i], m[i], a[i], o[i], static_cast<float>(lr), static_cast<float>(mu));
}

}  // namespace lightning_mccl::metal_reference
