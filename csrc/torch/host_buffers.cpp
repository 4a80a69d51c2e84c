#include "host_buffers.hpp"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace lightning_mccl {
namespace {

constexpr size_t kAlign = 16 << 10;

size_t size_class(size_t bytes) {
  size_t c = kAlign;
  while (c < bytes) c <<= 1;
  return c;
}

class Pool {
 public:
  static Pool& instance() {
    static auto* pool = new Pool();  // never destroyed: buffers may come back while the process exits
    return *pool;
  }

  void* take(size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& free = free_[cls];
      if (!free.empty()) {
        void* p = free.back();
        free.pop_back();
        cached_ -= cls;
        ++reused_;
        return p;
      }
      ++fresh_;
    }
    void* p = nullptr;
    TORCH_CHECK(posix_memalign(&p, kAlign, cls) == 0 && p != nullptr,
                "MCCL: out of host memory for a ", cls, "-byte staging buffer");
    return p;
  }

  void give_back(void* p, size_t cls) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + cls <= kMaxCachedHostBytes) {
        free_[cls].push_back(p);
        cached_ += cls;
        return;
      }
    }
    std::free(p);
  }

  HostBufferCounts counts() {
    std::lock_guard<std::mutex> lock(mu_);
    return {fresh_, reused_, cached_};
  }

 private:
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  uint64_t fresh_ = 0;
  uint64_t reused_ = 0;
};

}  // namespace

at::Tensor reused_host_buffer(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const auto cpu = options.device(at::kCPU).pinned_memory(false);
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(cpu.dtype()));
  if (bytes == 0) return at::empty(sizes, cpu);
  const size_t cls = size_class(bytes);
  void* p = Pool::instance().take(cls);
  return at::from_blob(p, sizes, [cls](void* q) { Pool::instance().give_back(q, cls); }, cpu);
}

HostBufferCounts host_buffer_counts() { return Pool::instance().counts(); }

}  // namespace lightning_mccl
