// Reduction entry points: the (dtype, op) dispatch happens once per call, never inside a loop, onto the
// kernels of reduce_kernels.h; buffers of 4 MiB or more are split over the pool of reduce_pool.h.
#include "reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "error.h"
#include "reduce_kernels.h"
#include "reduce_pool.h"

namespace mccl {
namespace {

template <class C, class Op>
void erased_into(void* dst, const void* src, const void*, size_t n, int64_t) {
  using S = typename C::Storage;
  kernel_into<C, Op>(static_cast<S*>(dst), static_cast<const S*>(src), n);
}
template <class C>
void erased_divide(void* buf, const void*, const void*, size_t n, int64_t divisor) {
  kernel_divide<C>(static_cast<typename C::Storage*>(buf), n, divisor);
}

// ---------------------------------------------------------------------------------------------------
// Dispatch: (dtype, op) -> kernel, once per call.

template <class C, template <class> class Op>
Kernel pick_op() {
  return &erased_into<C, Op<typename C::Compute>>;
}

template <class C>
Kernel pick_for(ReduceOp op) {
  if constexpr (std::is_same_v<typename C::Compute, bool>) {
    switch (op) {  // logical: SUM/MAX/BOR = or, PRODUCT/MIN/BAND = and
      case ReduceOp::kSum: case ReduceOp::kMax: case ReduceOp::kBor: return pick_op<C, BitOr>();
      case ReduceOp::kProduct: case ReduceOp::kMin: case ReduceOp::kBand: return pick_op<C, BitAnd>();
      case ReduceOp::kBxor: return pick_op<C, BitXor>();
      default: return nullptr;
    }
  } else {
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kAvg: return pick_op<C, Sum>();
      case ReduceOp::kProduct: return pick_op<C, Product>();
      case ReduceOp::kMin: return pick_op<C, Min>();
      case ReduceOp::kMax: return pick_op<C, Max>();
      default: break;
    }
    if constexpr (std::is_integral_v<typename C::Compute>) {
      switch (op) {
        case ReduceOp::kBand: return pick_op<C, BitAnd>();
        case ReduceOp::kBor: return pick_op<C, BitOr>();
        case ReduceOp::kBxor: return pick_op<C, BitXor>();
        default: break;
      }
    }
    return nullptr;
  }
}

// Calls f(codec) with a value of the codec type for dtype; returns nullptr for an unknown dtype.
template <class F>
Kernel with_codec(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat32: return f(Native<float>{});
    case DataType::kFloat64: return f(Native<double>{});
    case DataType::kFloat16: return f(Half{});
    case DataType::kBFloat16: return f(BFloat{});
    case DataType::kInt8: return f(Native<int8_t>{});
    case DataType::kUInt8: return f(Native<uint8_t>{});
    case DataType::kInt32: return f(Native<int32_t>{});
    case DataType::kInt64: return f(Native<int64_t>{});
    case DataType::kBool: return f(Bool{});
  }
  return nullptr;
}

Kernel pick_reduce(DataType dtype, ReduceOp op) {
  Kernel k = with_codec(dtype, [&](auto codec) { return pick_for<decltype(codec)>(op); });
  if (k == nullptr) fail(Error::Kind::kInternal, "no kernel for ", op_name(op), " on ", dtype_name(dtype));
  return k;
}

Kernel pick_divide(DataType dtype) {
  return with_codec(dtype, [](auto codec) -> Kernel {
    using C = decltype(codec);
    if constexpr (std::is_same_v<typename C::Compute, bool>) return nullptr;
    else return &erased_divide<C>;
  });
}

// ---------------------------------------------------------------------------------------------------
// Argument checks.

void require_supported(DataType dtype, ReduceOp op) {
  if (op_supported(dtype, op)) return;
  fail(Error::Kind::kInvalidArgument, "reduce op ", op_name(op), " (", int(op), ") is not supported for dtype ",
       dtype_name(dtype), " (", int(dtype), ")");
}

bool overlaps(const void* p, const void* q, size_t bytes) {
  auto x = reinterpret_cast<uintptr_t>(p), y = reinterpret_cast<uintptr_t>(q);
  return x < y + bytes && y < x + bytes;
}

// Validates the buffers of a non-empty call and returns the byte size of one element.
size_t check_buffers(const char* what, size_t count, DataType dtype, bool all_non_null) {
  size_t elem = dtype_size(dtype);
  MCCL_CHECK_ARG(all_non_null, what, ": null buffer for ", count, " elements");
  MCCL_CHECK_ARG(count <= SIZE_MAX / elem, what, ": count ", count, " is too large");
  return elem;
}

// x OP x: the kernels want non-overlapping buffers, so the operand goes through a small stack copy.
void reduce_self(Kernel into, void* buf, size_t count, size_t elem) {
  alignas(64) unsigned char tmp[16384];
  const size_t per = sizeof tmp / elem;
  char* p = static_cast<char*>(buf);
  for (size_t i = 0; i < count; i += per) {
    size_t n = std::min(per, count - i);
    std::memcpy(tmp, p + i * elem, n * elem);
    into(p + i * elem, tmp, nullptr, n, 0);
  }
}

}  // namespace

// -------------------------------------------------------------------------------------------------------
// Public interface.

bool op_supported(DataType dtype, ReduceOp op) {
  if (!is_valid_dtype(uint8_t(dtype)) || !is_valid_op(uint8_t(op))) return false;
  bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (dtype == DataType::kBool) return op != ReduceOp::kAvg;
  if (is_floating(dtype)) return !bitwise;
  return true;  // integer types: everything
}

void reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, size_t max_parts) {
  require_supported(dtype, op);
  if (count == 0) return;
  size_t elem = check_buffers("reduce_into", count, dtype, dst && src);
  if (dst == src) return reduce_self(pick_reduce(dtype, op), dst, count, elem);
  MCCL_CHECK_ARG(!overlaps(dst, src, count * elem), "reduce_into: dst and src overlap partially");
  run_split(pick_reduce(dtype, op), dst, src, nullptr, count, elem, 0, max_parts);
}

void divide_by(void* buf, size_t count, DataType dtype, int64_t divisor) {
  Kernel k = is_valid_dtype(uint8_t(dtype)) ? pick_divide(dtype) : nullptr;
  MCCL_CHECK_ARG(k != nullptr, "reduce op avg (division) is not supported for dtype ", dtype_name(dtype), " (",
                 int(dtype), ")");
  MCCL_CHECK_ARG(divisor > 0, "divide_by: divisor must be positive, got ", divisor);
  if (count == 0 || divisor == 1) return;
  MCCL_CHECK_ARG(buf != nullptr, "divide_by: null buffer for ", count, " elements");
  MCCL_CHECK_ARG(count <= SIZE_MAX / dtype_size(dtype), "divide_by: count ", count, " is too large");
  run_split(k, buf, nullptr, nullptr, count, dtype_size(dtype), divisor);
}

namespace {
void require_half(DataType half, const char* what) {
  MCCL_CHECK_ARG(half == DataType::kFloat16 || half == DataType::kBFloat16, what, ": ", dtype_name(half),
                 " is not a wire type (float16 or bfloat16)");
}
}  // namespace

const char* reduce_vector_path() {
#if defined(__aarch64__)
  return MCCL_NATIVE_FP16 ? "neon (float16 converted in hardware)" : "neon";
#elif defined(__x86_64__) && MCCL_HAVE_TARGET_CLONES
  return __builtin_cpu_supports("avx2") ? "avx2 (selected at run time)" : "sse2 (this cpu has no avx2)";
#elif defined(__x86_64__) && defined(__AVX2__)
  return "avx2 (the build's baseline)";
#elif defined(__x86_64__)
  return "sse2 (this build has no run-time selection)";
#else
  return "the compiler's vectorisation for this target";
#endif
}

void narrow_float32(void* dst, const float* src, size_t count, DataType half, size_t max_parts) {
  require_half(half, "narrow_float32");
  auto* out = static_cast<uint16_t*>(dst);
  run_parts(count, kSplitConversionsFrom, 64, max_parts, [&](size_t begin, size_t n) {
    if (half == DataType::kBFloat16) kernel_narrow<BFloat>(out + begin, src + begin, n);
    else kernel_narrow<Half>(out + begin, src + begin, n);
  });
}

void widen_to_float32(float* dst, const void* src, size_t count, DataType half, size_t max_parts) {
  require_half(half, "widen_to_float32");
  const auto* in = static_cast<const uint16_t*>(src);
  run_parts(count, kSplitConversionsFrom, 64, max_parts, [&](size_t begin, size_t n) {
    if (half == DataType::kBFloat16) kernel_widen<BFloat>(dst + begin, in + begin, n);
    else kernel_widen<Half>(dst + begin, in + begin, n);
  });
}

void round_float32_through(float* buf, size_t count, DataType half, size_t max_parts) {
  require_half(half, "round_float32_through");
  run_parts(count, kSplitConversionsFrom, 64, max_parts, [&](size_t begin, size_t n) {
    if (half == DataType::kBFloat16) kernel_round_through<BFloat>(buf + begin, n);
    else kernel_round_through<Half>(buf + begin, n);
  });
}

}  // namespace mccl
