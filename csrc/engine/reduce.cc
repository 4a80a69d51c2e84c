// Reduction kernels: plain counted loops over __restrict pointers, with the element codec and the op as
// template parameters, so g++ -O3 and clang auto-vectorise them. The (dtype, op) dispatch happens once
// per call, never inside a loop. Large buffers are split over a small persistent thread pool.
#include "reduce.h"

#include <unistd.h>  // getpid: a forked child must not wait on its parent's worker threads

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <type_traits>

#include "thread_name.h"

#include "error.h"

// Runtime SIMD selection on x86-64 Linux with g++: each kernel gets an AVX2 clone and a baseline clone,
// chosen once by an ifunc resolver. On arm64 NEON is the baseline: the same loops compile to NEON code
// (float16 through the hardware conversions, see Half below), checked by `make test-arm64`. Elsewhere
// (clang on x86) the loops are vectorised for the baseline (SSE2).
// Not under -fsanitize=thread: g++ instruments the resolver, which runs before TSan is initialised and crashes.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define MCCL_TARGET_CLONES __attribute__((target_clones("avx2", "default")))
#define MCCL_HAVE_TARGET_CLONES 1
#else
#define MCCL_TARGET_CLONES
#define MCCL_HAVE_TARGET_CLONES 0
#endif

namespace mccl {
namespace {

// ---------------------------------------------------------------------------------------------------
// Half-precision conversions. All branch-free (selects only) so the loops that use them vectorise.

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// c ? x : y through a mask (for the software float16 conversion). With a plain ?: g++ (-ftrapping-math)
// sinks the float arithmetic feeding only one side into a branch, which it then may not if-convert, and
// the loop stays scalar.
[[maybe_unused]] inline uint32_t select_bits(bool c, uint32_t x, uint32_t y) {
  uint32_t mask = 0u - uint32_t(c);
  return (x & mask) | (y & ~mask);
}

// bfloat16 -> float32 is exact: a bfloat16 is the top half of a float32.
inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// float32 -> bfloat16, round to nearest even: add 0x7FFF plus the lowest kept bit, then truncate.
// A NaN could round into Inf (or wrap), so NaN keeps its top bits with the quiet bit set instead.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (u >> 16) | 0x40u;
  bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return uint16_t(is_nan ? quiet_nan : rounded);
}

// arm64 converts float16 in hardware (the Half codec below); elsewhere these two functions do.
#if defined(__aarch64__) && defined(__ARM_FP16_FORMAT_IEEE)
#define MCCL_NATIVE_FP16 1
#else
#define MCCL_NATIVE_FP16 0

// float16 -> float32 (exact). Normal, Inf and NaN: move exponent+mantissa into float32 position with the
// exponent offset by 224, so half exponent 31 lands on 255 (Inf/NaN), then rebias by multiplying with
// 2^-112. Subnormal: put the mantissa m in the low bits of 0.5f (giving 0.5 + m*2^-24) and subtract 0.5.
inline float fp16_to_f32(uint16_t h) {
  uint32_t w = uint32_t(h) << 16;
  uint32_t sign = w & 0x80000000u;
  uint32_t two_w = w + w;  // sign shifted out; exponent in the top 5 bits
  float normal = bits_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  float subnormal = bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
  uint32_t magnitude = select_bits(two_w < (1u << 27), f32_bits(subnormal), f32_bits(normal));
  return bits_f32(sign | magnitude);
}

// float32 -> float16, round to nearest even. Scaling |f| by 2^112 then 2^-110 turns everything that
// overflows half into Inf. Adding a power of two ("bias") derived from f's exponent makes the FPU
// itself round the mantissa to exactly the bits half keeps (10, fewer for subnormals), ties to even;
// the half exponent and mantissa are then read out of the sum. NaN becomes the quiet NaN 0x7E00.
inline uint16_t f32_to_fp16(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t w = f32_bits(f);
  uint32_t shl1_w = w + w;
  uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;  // below half's normal range: fixed subnormal quantum
  base = bits_f32((bias >> 1) + 0x07800000u) + base;
  uint32_t bits = f32_bits(base);
  uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  uint32_t mantissa_bits = bits & 0x00000FFFu;
  uint32_t nonsign = exp_bits + mantissa_bits;  // a mantissa carry bumps the exponent, up to Inf
  return uint16_t((sign >> 16) | select_bits(shl1_w > 0xFF000000u, 0x7E00u, nonsign));
}
#endif

// ---------------------------------------------------------------------------------------------------
// Codecs: how an element is stored and in which type the op computes.

template <typename T>
struct Native {
  using Storage = T;
  using Compute = T;
  static T load(T x) { return x; }
  static T store(T x) { return x; }
};
#if MCCL_NATIVE_FP16
// arm64: the hardware converts (FCVT; in the loops FCVTL/FCVTN on 4 lanes), rounding to nearest even with
// subnormals kept, so the results equal the code above except for which quiet NaN a NaN becomes.
struct Half {
  using Storage = uint16_t;
  using Compute = float;
  static float load(uint16_t x) {
    __fp16 h;
    std::memcpy(&h, &x, sizeof h);
    return float(h);
  }
  static uint16_t store(float x) {
    __fp16 h = __fp16(x);
    uint16_t u;
    std::memcpy(&u, &h, sizeof u);
    return u;
  }
};
#else
struct Half {
  using Storage = uint16_t;
  using Compute = float;
  static float load(uint16_t x) { return fp16_to_f32(x); }
  static uint16_t store(float x) { return f32_to_fp16(x); }
};
#endif
struct BFloat {
  using Storage = uint16_t;
  using Compute = float;
  static float load(uint16_t x) { return bf16_to_f32(x); }
  static uint16_t store(float x) { return f32_to_bf16(x); }
};
struct Bool {  // bytes; any nonzero input counts as true, outputs are exactly 0 or 1
  using Storage = uint8_t;
  using Compute = bool;
  static bool load(uint8_t x) { return x != 0; }
  static uint8_t store(bool x) { return uint8_t(x); }
};

// ---------------------------------------------------------------------------------------------------
// Ops. Integer SUM/PRODUCT run in the unsigned type so overflow wraps instead of being UB. Float MIN/MAX
// return a NaN operand if there is one (a bitwise | keeps the select branch-free).

template <typename T>
using Unsigned =
    typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::common_type<T>>::type;

template <typename T>
struct Sum {
  static T apply(T a, T b) { return T(Unsigned<T>(a) + Unsigned<T>(b)); }
};
template <typename T>
struct Product {
  static T apply(T a, T b) { return T(Unsigned<T>(a) * Unsigned<T>(b)); }
};
template <typename T>
struct Min {
  static T apply(T a, T b) { return ((a < b) | (a != a)) ? a : b; }
};
template <typename T>
struct Max {
  static T apply(T a, T b) { return ((a > b) | (a != a)) ? a : b; }
};
template <typename T>
struct BitAnd {
  static T apply(T a, T b) { return T(a & b); }
};
template <typename T>
struct BitOr {
  static T apply(T a, T b) { return T(a | b); }
};
template <typename T>
struct BitXor {
  static T apply(T a, T b) { return T(a ^ b); }
};

// ---------------------------------------------------------------------------------------------------
// Kernels (the only loops over elements).

// dst[i] = dst[i] OP src[i].
template <class C, class Op>
MCCL_TARGET_CLONES void kernel_into(typename C::Storage* __restrict dst,
                                    const typename C::Storage* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = C::store(Op::apply(C::load(dst[i]), C::load(src[i])));
}

// buf[i] /= divisor: floating types divide in their compute type, integers truncate toward zero.
template <class C>
MCCL_TARGET_CLONES void kernel_divide(typename C::Storage* __restrict buf, size_t n, int64_t divisor) {
  using T = typename C::Compute;
  if constexpr (std::is_floating_point_v<T>) {
    const T d = T(divisor);
    for (size_t i = 0; i < n; ++i) buf[i] = C::store(C::load(buf[i]) / d);
  } else {
    for (size_t i = 0; i < n; ++i) buf[i] = T(int64_t(buf[i]) / divisor);
  }
}

// Wire compression: float32 to and from a half type (C = Half or BFloat), rounding to nearest even.
template <class C>
MCCL_TARGET_CLONES void kernel_narrow(uint16_t* __restrict dst, const float* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = C::store(src[i]);
}
template <class C>
MCCL_TARGET_CLONES void kernel_widen(float* __restrict dst, const uint16_t* __restrict src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = C::load(src[i]);
}
template <class C>
MCCL_TARGET_CLONES void kernel_round_through(float* __restrict buf, size_t n) {
  for (size_t i = 0; i < n; ++i) buf[i] = C::load(C::store(buf[i]));
}

// Type-erased entry points, so dispatch and threading work on one function-pointer type.
using Kernel = void (*)(void* out, const void* a, const void* b, size_t n, int64_t divisor);

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
// Threading for large buffers.

constexpr size_t kParallelBytes = size_t(4) << 20;  // below this, run inline on the caller
constexpr size_t kMaxParts = 4;

// One call's work: parts [0, parts) of `count` elements, each `chunk` long (the last may be shorter).
struct Task {
  Kernel fn;
  char* out;
  const char* a;
  const char* b;
  size_t elem;
  size_t count;
  size_t chunk;
  int64_t divisor;
};

void run_part(const Task& t, size_t part) {
  size_t begin = part * t.chunk;
  if (begin >= t.count) return;
  size_t n = std::min(t.chunk, t.count - begin);
  size_t off = begin * t.elem;
  t.fn(t.out + off, t.a ? t.a + off : nullptr, t.b ? t.b + off : nullptr, n, t.divisor);
}

// Persistent workers blocked on a condition variable. One job at a time: a caller that finds the pool
// busy (another communicator thread) runs its job inline instead of waiting. The caller does part 0
// itself; worker i does part i+1. The pool is leaked on purpose, with detached workers, so process exit
// has nothing to tear down.
class Pool {
 public:
  static Pool* instance() {
    static Pool* pool = new Pool(std::min<size_t>(kMaxParts, std::thread::hardware_concurrency()));
    return pool;
  }

  size_t width() const { return workers_ + 1; }

  // Runs task parts [0, parts) (parts <= width()) and returns true, or returns false if busy.
  bool try_run(const Task& task, size_t parts) {
    if (getpid() != pid_) return false;  // forked child: the workers did not come along
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      parts_ = parts;
      pending_ = parts - 1;
      ++generation_;
    }
    wake_.notify_all();
    run_part(task, 0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
    parts_ = 0;
    return true;
  }

 private:
  explicit Pool(size_t width) : pid_(getpid()) {
    size_t started = 0;
    for (size_t part = 1; part < width; ++part) {
      try {
        std::thread([this, part] {
          set_thread_name("mccl-reduce");
          worker(part);
        }).detach();
        ++started;
      } catch (const std::exception&) {
        break;  // could not start a thread: use the ones we have (possibly none: inline)
      }
    }
    workers_ = started;
  }

  void worker(size_t part) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (task_ == nullptr || part >= parts_) continue;  // job already over, or not needed for it
      const Task* task = task_;
      lock.unlock();
      run_part(*task, part);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  const pid_t pid_;
  size_t workers_ = 0;
  std::mutex busy_;  // held for a whole job
  std::mutex mu_;    // guards the fields below
  std::condition_variable wake_, done_;
  const Task* task_ = nullptr;
  size_t parts_ = 0;
  size_t pending_ = 0;
  uint64_t generation_ = 0;
};

void launch(Kernel fn, void* out, const void* a, const void* b, size_t count, size_t elem, int64_t divisor) {
  if (count * elem >= kParallelBytes) {
    Pool* pool = Pool::instance();
    size_t parts = pool->width();
    if (parts > 1) {
      size_t chunk = (count + parts - 1) / parts;
      chunk = (chunk + 63) / 64 * 64;  // keep part boundaries vector- and cache-line friendly
      Task task{fn, static_cast<char*>(out), static_cast<const char*>(a), static_cast<const char*>(b),
                elem, count, chunk, divisor};
      if (pool->try_run(task, parts)) return;
    }
  }
  fn(out, a, b, count, divisor);
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

void reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op) {
  require_supported(dtype, op);
  if (count == 0) return;
  size_t elem = check_buffers("reduce_into", count, dtype, dst && src);
  if (dst == src) return reduce_self(pick_reduce(dtype, op), dst, count, elem);
  MCCL_CHECK_ARG(!overlaps(dst, src, count * elem), "reduce_into: dst and src overlap partially");
  launch(pick_reduce(dtype, op), dst, src, nullptr, count, elem, 0);
}

void divide_by(void* buf, size_t count, DataType dtype, int64_t divisor) {
  Kernel k = is_valid_dtype(uint8_t(dtype)) ? pick_divide(dtype) : nullptr;
  MCCL_CHECK_ARG(k != nullptr, "reduce op avg (division) is not supported for dtype ", dtype_name(dtype), " (",
                 int(dtype), ")");
  MCCL_CHECK_ARG(divisor > 0, "divide_by: divisor must be positive, got ", divisor);
  if (count == 0 || divisor == 1) return;
  MCCL_CHECK_ARG(buf != nullptr, "divide_by: null buffer for ", count, " elements");
  MCCL_CHECK_ARG(count <= SIZE_MAX / dtype_size(dtype), "divide_by: count ", count, " is too large");
  launch(k, buf, nullptr, nullptr, count, dtype_size(dtype), divisor);
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

void narrow_float32(void* dst, const float* src, size_t count, DataType half) {
  require_half(half, "narrow_float32");
  auto* out = static_cast<uint16_t*>(dst);
  if (half == DataType::kBFloat16) kernel_narrow<BFloat>(out, src, count);
  else kernel_narrow<Half>(out, src, count);
}

void widen_to_float32(float* dst, const void* src, size_t count, DataType half) {
  require_half(half, "widen_to_float32");
  const auto* in = static_cast<const uint16_t*>(src);
  if (half == DataType::kBFloat16) kernel_widen<BFloat>(dst, in, count);
  else kernel_widen<Half>(dst, in, count);
}

void round_float32_through(float* buf, size_t count, DataType half) {
  require_half(half, "round_float32_through");
  if (half == DataType::kBFloat16) kernel_round_through<BFloat>(buf, count);
  else kernel_round_through<Half>(buf, count);
}

}  // namespace mccl
