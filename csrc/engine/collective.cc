#include "collective.h"

#include <algorithm>

namespace mccl {

FrameHeader Collective::frame(uint64_t offset, uint64_t count, uint32_t step) const {
  FrameHeader h = identity_;
  h.offset = offset;
  h.count = count;
  h.step = step;
  return h;
}

RequestPtr Collective::send(int peer, const void* data, size_t bytes, uint64_t offset, uint32_t step) {
  return transport_.post_send(peer, frame(offset, identity_.count, step), data, bytes);
}

RequestPtr Collective::recv(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step) {
  return transport_.post_recv(peer, frame(offset, identity_.count, step), data, bytes);
}

RequestPtr Collective::send_counted(int peer, const void* data, size_t bytes, uint64_t count, uint32_t step) {
  return transport_.post_send(peer, frame(0, count, step), data, bytes);
}

RequestPtr Collective::recv_counted(int peer, void* data, size_t bytes, uint64_t count, uint32_t step) {
  return transport_.post_recv(peer, frame(0, count, step), data, bytes);
}

char* Collective::scratch(int slot, size_t bytes) {
  std::vector<char>& buffer = scratch_[slot];
  if (buffer.size() < bytes) {
    buffer.clear();
    buffer.shrink_to_fit();
    buffer.resize(bytes);
  }
  return buffer.data();
}

size_t Collective::piece_bytes(size_t element_size) const {
  size_t elements = std::max<size_t>(1, config_.chunk_bytes / element_size);
  return elements * element_size;
}

}  // namespace mccl
