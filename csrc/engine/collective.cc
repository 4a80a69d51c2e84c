#include "collective.h"

#include <algorithm>

#include "reduce.h"

namespace mccl {

FrameHeader Collective::frame(uint64_t offset, uint64_t count, uint32_t step) const {
  FrameHeader h = identity_;
  h.offset = offset;
  h.count = count;
  h.step = step;
  return h;
}

char* WireBuffers::take(size_t bytes) {
  while (!in_use_.empty() && (!in_use_.front().request || in_use_.front().request->done)) {
    free_.push_back(std::move(in_use_.front().bytes));
    in_use_.pop_front();
  }
  Entry entry;
  if (!free_.empty()) {
    entry.bytes = std::move(free_.back());
    free_.pop_back();
  }
  if (entry.bytes.size() < bytes) entry.bytes.resize(bytes);
  in_use_.push_back(std::move(entry));
  return in_use_.back().bytes.data();
}

void WireBuffers::release_all() {
  for (auto& entry : in_use_) free_.push_back(std::move(entry.bytes));
  in_use_.clear();
}

RequestPtr Collective::post_send(int peer, const FrameHeader& header, const void* data, size_t bytes) {
  if (!compressed() || bytes == 0) return transport_.post_send(peer, header, data, bytes);
  const size_t count = bytes / sizeof(float);
  const auto wire_type = static_cast<DataType>(header.wire_dtype);
  char* wire = wire_->take(count * dtype_size(wire_type));
  narrow_float32(wire, static_cast<const float*>(data), count, wire_type);
  RequestPtr request = transport_.post_send(peer, header, wire, count * dtype_size(wire_type));
  wire_->hold(request);
  return request;
}

RequestPtr Collective::post_recv(int peer, const FrameHeader& header, void* data, size_t bytes) {
  if (!compressed() || bytes == 0) return transport_.post_recv(peer, header, data, bytes);
  const size_t count = bytes / sizeof(float);
  const auto wire_type = static_cast<DataType>(header.wire_dtype);
  char* wire = wire_->take(count * dtype_size(wire_type));
  auto widen = [wire, out = static_cast<float*>(data), count, wire_type](const Request&, std::exception_ptr error) {
    if (!error) widen_to_float32(out, wire, count, wire_type);
  };
  RequestPtr request = transport_.post_recv(peer, header, wire, count * dtype_size(wire_type), widen);
  wire_->hold(request);
  return request;
}

RequestPtr Collective::send(int peer, const void* data, size_t bytes, uint64_t offset, uint32_t step) {
  return post_send(peer, frame(offset, identity_.count, step), data, bytes);
}

RequestPtr Collective::recv(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step) {
  return post_recv(peer, frame(offset, identity_.count, step), data, bytes);
}

RequestPtr Collective::send_counted(int peer, const void* data, size_t bytes, uint64_t count, uint32_t step) {
  return post_send(peer, frame(0, count, step), data, bytes);
}

RequestPtr Collective::recv_counted(int peer, void* data, size_t bytes, uint64_t count, uint32_t step) {
  return post_recv(peer, frame(0, count, step), data, bytes);
}

void Collective::round_to_wire(void* data, size_t bytes) {
  if (compressed() && bytes > 0)
    round_float32_through(static_cast<float*>(data), bytes / sizeof(float), static_cast<DataType>(identity_.wire_dtype));
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
