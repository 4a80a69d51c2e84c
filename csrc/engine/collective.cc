#include "collective.h"

#include <algorithm>

#include "reduce.h"
#include "reduce_pool.h"

namespace mccl {

FrameHeader Collective::frame(uint64_t offset, uint64_t count, uint32_t step) const {
  FrameHeader h = identity_;
  h.offset = offset;
  h.count = count;
  h.step = step;
  return h;
}

// An entry with no request yet was taken and is still to be posted (wire_buffer() before send_narrowed()):
// it is in use like one whose request is pending.
char* WireBuffers::take(size_t bytes) {
  while (!in_use_.empty() && !in_use_.front().kept && in_use_.front().request && in_use_.front().request->done) {
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

// From the newest: the request asked about is one of the latest posted.
WireBuffers::Entry* WireBuffers::find(const RequestPtr& request) {
  for (auto it = in_use_.rbegin(); it != in_use_.rend(); ++it) {
    if (it->request == request) return &*it;
  }
  return nullptr;
}

void WireBuffers::pass_on(const RequestPtr& from, RequestPtr to) {
  if (Entry* entry = find(from)) {
    entry->request = std::move(to);
    entry->kept = false;
  }
}

void WireBuffers::release(const RequestPtr& from) {
  if (Entry* entry = find(from)) entry->kept = false;
}

void WireBuffers::release_all() {
  for (auto& entry : in_use_) free_.push_back(std::move(entry.bytes));
  in_use_.clear();
}

RequestPtr Collective::post_send(int peer, const FrameHeader& header, const void* data, size_t bytes) {
  if (!compressed() || bytes == 0) return transport_.post_send(peer, header, data, bytes);
  const size_t on_wire = wire_bytes(bytes);
  char* wire = wire_->take(on_wire);
  narrow_float32(wire, static_cast<const float*>(data), bytes / sizeof(float), wire_type(), reduce_threads_);
  RequestPtr request = transport_.post_send(peer, header, wire, on_wire);
  wire_->hold(request);
  return request;
}

RequestPtr Collective::post_recv(int peer, const FrameHeader& header, void* data, size_t bytes, bool kept) {
  if (!compressed() || bytes == 0) return transport_.post_recv(peer, header, data, bytes);
  const size_t on_wire = wire_bytes(bytes);
  char* wire = wire_->take(on_wire);
  auto widen = [wire, out = static_cast<float*>(data), count = bytes / sizeof(float), type = wire_type(),
                threads = reduce_threads_](const Request&, std::exception_ptr error) {
    if (!error) widen_to_float32(out, wire, count, type, threads);
  };
  RequestPtr request = transport_.post_recv(peer, header, wire, on_wire, widen);
  wire_->hold(request, kept);
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

RequestPtr Collective::recv_to_forward(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step) {
  return post_recv(peer, frame(offset, identity_.count, step), data, bytes, /*kept=*/true);
}

RequestPtr Collective::forward(int peer, const RequestPtr& received, uint64_t offset, uint32_t step) {
  RequestPtr request = transport_.post_send(peer, frame(offset, identity_.count, step), received->data,
                                            received->length);
  if (compressed() && received->length > 0) wire_->pass_on(received, request);
  return request;
}

RequestPtr Collective::recv_for_reduce(int peer, void* landing, size_t bytes, uint64_t offset, uint32_t step) {
  const FrameHeader header = frame(offset, identity_.count, step);
  if (!compressed()) return transport_.post_recv(peer, header, landing, bytes);
  const size_t on_wire = wire_bytes(bytes);  // an empty piece too: `landing` may be null
  RequestPtr request = transport_.post_recv(peer, header, wire_->take(on_wire), on_wire);
  wire_->hold(request, /*kept=*/true);  // until reduce_received has read it
  return request;
}

char* Collective::wire_buffer(size_t bytes) {
  if (!compressed() || bytes == 0) return nullptr;
  return wire_->take(wire_bytes(bytes));
}

RequestPtr Collective::send_narrowed(int peer, const void* data, char* narrowed, size_t bytes, uint64_t offset,
                                     uint32_t step) {
  if (narrowed == nullptr) return send(peer, data, bytes, offset, step);
  RequestPtr request = transport_.post_send(peer, frame(offset, identity_.count, step), narrowed, wire_bytes(bytes));
  wire_->hold(request);  // the buffer wire_buffer() took last
  return request;
}

void Collective::reduce(void* dst, const void* src, size_t count) const {
  reduce_into(dst, src, count, dtype(), op(), reduce_threads_);
}

void Collective::reduce_piece(void* dst, const RequestPtr& received, size_t bytes, char* narrowed, bool final) {
  const int divisor = final && op() == ReduceOp::kAvg ? size() : 1;
  if (!compressed()) {
    const size_t count = bytes / dtype_size(dtype());
    reduce(dst, received->data, count);
    if (divisor > 1) divide_by(dst, count, dtype(), divisor);
    return;
  }
  const DataType type = wire_type();
  const size_t wire_size = dtype_size(type);
  constexpr size_t kTile = 4096;  // floats: 16 KiB, stays in L1 between the widen and the reduction
  const char* src = received->data;
  float* out = static_cast<float*>(dst);
  // Each thread takes whole tiles of the piece: widen, reduce (divide, narrow, round), one pass over memory.
  run_parts(bytes / sizeof(float), kSplitConversionsFrom, kTile, reduce_threads_, [&](size_t begin, size_t len) {
    alignas(64) float tile[kTile];
    for (size_t i = begin; i < begin + len; i += kTile) {
      const size_t n = std::min(kTile, begin + len - i);
      widen_to_float32(tile, src + i * wire_size, n, type, 1);
      reduce_into(out + i, tile, n, DataType::kFloat32, op(), 1);
      if (divisor > 1) divide_by(out + i, n, DataType::kFloat32, divisor);
      if (!narrowed) continue;
      narrow_float32(narrowed + i * wire_size, out + i, n, type, 1);
      if (final) widen_to_float32(out + i, narrowed + i * wire_size, n, type, 1);
    }
  });
  wire_->release(received);
}

RequestPtr Collective::recv_counted(int peer, void* data, size_t bytes, uint64_t count, uint32_t step) {
  return post_recv(peer, frame(0, count, step), data, bytes);
}

void Collective::round_to_wire(void* data, size_t bytes) {
  if (compressed() && bytes > 0)
    round_float32_through(static_cast<float*>(data), bytes / sizeof(float), wire_type(), reduce_threads_);
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
  const size_t on_wire = compressed() && element_size == sizeof(float) ? dtype_size(wire_type()) : element_size;
  size_t elements = std::max<size_t>(1, config_.chunk_bytes / on_wire);
  return elements * element_size;
}

}  // namespace mccl
