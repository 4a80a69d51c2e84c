#include "stream_order.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <map>
#include <mutex>
#include <utility>

namespace lightning_mccl {

c10::Stream current_stream(const c10::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

c10::Stream side_stream(const c10::Device& device) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, c10::Stream> streams;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(static_cast<int>(device.type()), static_cast<int>(device.index()));
  auto it = streams.find(key);
  if (it != streams.end()) return it->second;
  auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  c10::Stream stream = impl->getStream(device);
  try {
    stream = impl->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  } catch (const c10::Error&) {
    // A device without a stream pool: the current stream.
  }
  streams.emplace(key, stream);
  return stream;
}

Mark mark(const c10::Stream& stream) {
  auto event = std::make_shared<c10::Event>(stream.device_type());
  event->record(stream);
  return event;
}

void order_after(const c10::Stream& earlier, const c10::Stream& later) {
  if (earlier == later) return;  // a stream is ordered after itself
  c10::Event event(earlier.device_type());
  event.record(earlier);
  event.block(later);
}

std::function<void()> host_wait(std::vector<Mark> marks) {
  if (marks.empty()) return nullptr;
  return [marks = std::move(marks)] {
    for (const auto& m : marks) m->synchronize();
  };
}

}  // namespace lightning_mccl
