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

// An entry with no request yet was taken and is still to be posted (an onward encoding before its send):
// it is in use like one whose request is pending.
bool WireBuffers::Entry::done() const {
  if (!request || !request->done) return false;
  for (const RequestPtr& other : others)
    if (!other->done) return false;
  return true;
}

char* WireBuffers::take(size_t bytes) {
  while (!in_use_.empty() && !in_use_.front().kept && in_use_.front().done()) {
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

void WireBuffers::hold(RequestPtr request, bool kept) {
  Entry& entry = in_use_.back();
  if (entry.request) entry.others.push_back(std::move(entry.request));
  entry.request = std::move(request);
  entry.kept = kept;
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

Collective::Collective(Transport& transport, const Config& config, size_t reduce_threads, std::vector<char>* scratch,
                       WireBuffers* wire, FrameHeader identity, Deadline deadline)
    : transport_(transport), config_(config), scratch_(scratch), wire_(wire), identity_(identity), deadline_(deadline),
      codec_(Codec::make(static_cast<WireType>(identity.wire_dtype), dtype(), op(), size(), reduce_threads)),
      element_size_(dtype_size(dtype())),
      piece_bytes_(codec_->piece_elements(config.chunk_bytes) * element_size_) {}

RequestPtr Collective::post_send(int peer, const FrameHeader& header, const void* data, size_t bytes) {
  if (codec_->in_place() || bytes == 0) return transport_.post_send(peer, header, data, bytes);
  const size_t count = elements(bytes), on_wire = codec_->wire_bytes(count);
  char* wire = wire_->take(on_wire);
  codec_->encode(wire, data, count);
  RequestPtr request = transport_.post_send(peer, header, wire, on_wire);
  wire_->hold(request);
  return request;
}

RequestPtr Collective::post_recv(int peer, const FrameHeader& header, void* data, size_t bytes, bool kept) {
  if (codec_->in_place() || bytes == 0) return transport_.post_recv(peer, header, data, bytes);
  const size_t count = elements(bytes), on_wire = codec_->wire_bytes(count);
  char* wire = wire_->take(on_wire);
  auto decode = [wire, data, count, codec = codec_](const Request&, std::exception_ptr error) {
    if (!error) codec->decode(data, wire, count);
  };
  RequestPtr request = transport_.post_recv(peer, header, wire, on_wire, decode);
  wire_->hold(request, kept);
  return request;
}

RequestPtr Collective::send(int peer, const void* data, size_t bytes, uint64_t offset, uint32_t step) {
  return post_send(peer, frame(offset, identity_.count, step), data, bytes);
}

RequestPtr Collective::recv(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step) {
  return post_recv(peer, frame(offset, identity_.count, step), data, bytes, /*kept=*/false);
}

RequestPtr Collective::send_counted(int peer, const void* data, size_t bytes, uint64_t count, uint32_t step) {
  return post_send(peer, frame(0, count, step), data, bytes);
}

RequestPtr Collective::recv_counted(int peer, void* data, size_t bytes, uint64_t count, uint32_t step) {
  return post_recv(peer, frame(0, count, step), data, bytes, /*kept=*/false);
}

RequestPtr Collective::recv_to_forward(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step) {
  return post_recv(peer, frame(offset, identity_.count, step), data, bytes, /*kept=*/true);
}

RequestPtr Collective::forward(int peer, const RequestPtr& received, uint64_t offset, uint32_t step) {
  RequestPtr request = transport_.post_send(peer, frame(offset, identity_.count, step), received->data,
                                            received->length);
  if (!codec_->in_place() && received->length > 0) wire_->pass_on(received, request);
  return request;
}

RequestPtr Collective::recv_to_reduce(int peer, size_t bytes, uint64_t offset, uint32_t step) {
  const size_t on_wire = codec_->wire_bytes(elements(bytes));
  RequestPtr request = transport_.post_recv(peer, frame(offset, identity_.count, step), wire_->take(on_wire), on_wire);
  wire_->hold(request, /*kept=*/true);  // until the reduction has read it
  return request;
}

void Collective::reduce_received(void* dst, const RequestPtr& received, size_t bytes, const void* own) {
  codec_->reduce(dst, received->data, elements(bytes), Fold{nullptr, own});
  wire_->release(received);
}

RequestPtr Collective::reduce_and_send(void* dst, const RequestPtr& received, size_t bytes, const Onward& to,
                                       const void* own) {
  std::vector<RequestPtr> sends;
  fold_and_send(dst, received, bytes, &to, 1, Fold{nullptr, own, /*final=*/false}, &sends);
  return sends.front();
}

RequestPtr Collective::reduce_final_and_send(void* dst, const RequestPtr& received, size_t bytes, const Onward& to) {
  std::vector<RequestPtr> sends;
  fold_and_send(dst, received, bytes, &to, 1, Fold{nullptr, nullptr, /*final=*/true}, &sends);
  return sends.front();
}

void Collective::reduce_final_into(void* dst, const RequestPtr& received, size_t bytes, char* into, float* error,
                                   const std::vector<Onward>& to, std::vector<RequestPtr>* sends) {
  fold_and_send(dst, received, bytes, to.data(), to.size(), Fold{into, nullptr, /*final=*/true, error}, sends);
}

// In place, the result is sent from `dst` itself; otherwise it is encoded in the same pass, into `how.onward` or a
// wire buffer, which every send of it then holds.
void Collective::fold_and_send(void* dst, const RequestPtr& received, size_t bytes, const Onward* to,
                               size_t destinations, const Fold& how, std::vector<RequestPtr>* sends) {
  const size_t count = elements(bytes);
  const bool in_place = codec_->in_place(), borrowed = how.onward != nullptr;
  const size_t on_wire = in_place ? bytes : codec_->wire_bytes(count);
  char* onward = in_place ? nullptr : borrowed ? how.onward : wire_->take(on_wire);
  codec_->reduce(dst, received->data, count, Fold{onward, how.own, how.final, how.error});
  wire_->release(received);
  for (size_t k = 0; k < destinations; ++k) {
    const FrameHeader header = frame(to[k].offset, identity_.count, to[k].step);
    sends->push_back(transport_.post_send(to[k].peer, header, in_place ? dst : onward, on_wire));
    if (!in_place && !borrowed) wire_->hold(sends->back());  // the buffer taken last: `onward`
  }
}

RequestPtr Collective::send_encoded(int peer, const char* wire, size_t count, uint64_t offset, uint32_t step) {
  return transport_.post_send(peer, frame(offset, identity_.count, step), wire, codec_->wire_bytes(count));
}

RequestPtr Collective::recv_encoded(int peer, char* wire, size_t count, uint64_t offset, uint32_t step) {
  return transport_.post_recv(peer, frame(offset, identity_.count, step), wire, codec_->wire_bytes(count));
}

void Collective::encode(char* wire, const void* data, size_t count, float* error) {
  codec_->encode(wire, data, count, error);
}

void Collective::decode(void* data, const char* wire, size_t count) { codec_->decode(data, wire, count); }

void Collective::keep_as_sent(void* data, size_t bytes) {
  if (bytes > 0) codec_->round(data, elements(bytes));
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

}  // namespace mccl
