// The Metal kernels' own text (src/lightning_mccl/metal/kernels.metal, with the Metal branch of arithmetic.h),
// compiled as C++ against a mock of the few Metal names it uses (mock_metal/metal_stdlib) and run on CPU threads,
// 32 to a SIMD group as a Mac runs them: int8_encode's blocks and residuals and int8_decode's values (written and
// added) against the engine's codec, bit for bit, on the cases of test_metal_arithmetic (also a short last block,
// with and without error feedback); pseudo_gradient and outer_step against the arithmetic they call. This checks
// the kernels' indexing, their sharing of a block among 32 threads and the scale's bytes; not Metal itself (its
// compiler, a GPU's floats): tests/torch/test_metal_kernels.py does that on a Mac.
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "check.h"
#include "codec.h"
#include "int8_blocks.h"
#include "int8_cases.h"

#include <metal_stdlib>  // the mock: include nothing after it that needs `thread`, `device`, `constant`, `kernel`
#include "kernels.metal"
#undef kernel
#undef device
#undef constant
#undef thread

namespace {

// kernel(thread_position_in_grid, thread_index_in_simdgroup) for `groups` SIMD groups of 32 threads, one after
// another, each thread on a CPU thread.
template <typename Kernel>
void run_simd_groups(size_t groups, Kernel kernel_body) {
  for (size_t g = 0; g < groups; ++g) {
    metal::SimdGroup group;
    std::vector<std::thread> lanes;
    for (uint lane = 0; lane < metal::SimdGroup::kWidth; ++lane) {
      lanes.emplace_back([&group, &kernel_body, g, lane] {
        metal::simd_group = &group;
        kernel_body(static_cast<uint>(g * metal::SimdGroup::kWidth + lane), lane);
      });
    }
    for (std::thread& t : lanes) t.join();
  }
}

size_t rows(size_t count) { return (count + kBlock - 1) / kBlock; }

// int8_encode over `count` values, as lightning_mccl.metal launches it: 32 threads a block.
std::vector<uint8_t> encode(const std::vector<float>& values, float* residual) {
  std::vector<uint8_t> blocks(rows(values.size()) * kRow, 0xEE);
  const long count = static_cast<long>(values.size()), feedback = residual != nullptr ? 1 : 0;
  run_simd_groups(rows(values.size()), [&](uint thread_id, uint lane) {
    int8_encode(values.data(), residual ? residual : const_cast<float*>(values.data()), blocks.data(), count,
                feedback, thread_id, lane);
  });
  return blocks;
}

std::vector<char> engine_wire(const std::vector<float>& values, float* residual) {
  std::vector<char> wire(mccl::int8_wire_bytes(values.size()));
  mccl::Codec::make(mccl::WireType::kInt8Blocks, mccl::DataType::kFloat32, mccl::ReduceOp::kSum, 1, 1)
      ->encode(wire.data(), values.data(), values.size(), residual);
  return wire;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(int8_encode_gives_the_engines_bytes_and_residuals) {
  for (size_t count : {size_t(1), size_t(255), size_t(256), size_t(257), size_t(5000)}) {
    for (bool feedback : {false, true}) {
      const std::vector<float> x = mccl_test::values_of_every_kind(count, count);
      std::vector<float> engine_residual = mccl_test::values_of_every_kind(count, 8 + count);
      for (float& r : engine_residual) r *= 1e-3f;
      std::vector<float> kernel_residual = engine_residual;
      const std::vector<char> wire = engine_wire(x, feedback ? engine_residual.data() : nullptr);
      const std::vector<uint8_t> blocks = encode(x, feedback ? kernel_residual.data() : nullptr);
      CHECK_MSG(std::memcmp(blocks.data(), wire.data(), wire.size()) == 0, "%zu values (feedback %d): the bytes differ",
                count, int(feedback));
      CHECK_MSG(same_bits(kernel_residual, engine_residual), "%zu values: the residuals differ", count);
      CHECK_MSG(count % kBlock == 0 || blocks.back() == 0xEE, "%zu values: a code past the end was written", count);
    }
  }
}

TEST(int8_decode_gives_the_engines_values_written_and_added) {
  const size_t count = 5000;
  const std::vector<char> wire = engine_wire(mccl_test::values_of_every_kind(count, 3), nullptr);
  std::vector<uint8_t> blocks(rows(count) * kRow);
  std::memcpy(blocks.data(), wire.data(), wire.size());
  std::vector<float> want(count);
  mccl::int8_decode(want.data(), wire.data(), count, 1);
  const std::vector<float> base = mccl_test::values_of_every_kind(count, 4);
  std::vector<float> written(count, -1.0f), added = base;
  for (uint i = 0; i < count; ++i) {
    int8_decode(blocks.data(), written.data(), 0, i);
    int8_decode(blocks.data(), added.data(), 1, i);
  }
  CHECK(same_bits(written, want));
  size_t differ = 0;
  for (size_t i = 0; i < count; ++i) {
    const float sum = base[i] + want[i];
    differ += std::isnan(sum) ? f32_bits(added[i]) != kNaNBits : f32_bits(added[i]) != f32_bits(sum);
  }
  CHECK_MSG(differ == 0, "%zu sums differ", differ);
}

TEST(the_diloco_kernels_apply_their_arithmetic_to_every_value) {
  mccl_test::Random random{9};
  const size_t count = 1000;
  std::vector<float> anchor(count), flat(count), own(count), mean(count), momentum(count);
  for (size_t i = 0; i < count; ++i) {
    anchor[i] = static_cast<float>(random.normal());
    flat[i] = static_cast<float>(random.normal());
    mean[i] = static_cast<float>(random.normal() * 1e-2);
    momentum[i] = static_cast<float>(random.normal() * 1e-2);
  }
  const std::vector<float> weights = flat;
  for (uint i = 0; i < count; ++i) pseudo_gradient(anchor.data(), flat.data(), own.data(), i);
  std::vector<float> want_m = momentum, want_a = anchor, want_o(count);
  for (size_t i = 0; i < count; ++i) {
    want_o[i] = anchor[i] - weights[i];
    mccl_arith::diloco_outer_step(mean[i], want_m[i], want_a[i], want_o[i], 0.7f, 0.9f);
  }
  CHECK(same_bits(flat, own));
  for (size_t i = 0; i < count; ++i) CHECK(f32_bits(own[i]) == f32_bits(anchor[i] - weights[i]));
  const float lr = 0.7f, mu = 0.9f;
  for (uint i = 0; i < count; ++i) outer_step(mean.data(), momentum.data(), anchor.data(), own.data(), lr, mu, i);
  CHECK(same_bits(momentum, want_m) && same_bits(anchor, want_a) && same_bits(own, want_o));
}

MCCL_TEST_MAIN
