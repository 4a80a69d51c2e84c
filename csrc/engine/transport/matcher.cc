#include "transport/matcher.h"

#include <algorithm>
#include <cstring>

#include "error.h"

namespace mccl {
namespace {
constexpr size_t kStashFirstBytes = size_t(64) << 20;  // an unexpected frame's first buffer, at most
constexpr size_t kMaxSpareBytes = size_t(8) << 20;     // kept for reuse, all spare buffers together
}  // namespace

bool Matcher::matches(const Request& r, int source, const FrameHeader& h) const {
  return (r.peer == kAnySource || r.peer == source) && r.header.channel == h.channel && r.header.seq == h.seq;
}

void Matcher::validate(const Request& r, const FrameHeader& h, int source) const {
  std::string problem;
  if (h.channel == static_cast<uint8_t>(Channel::kCollective)) {
    FrameHeader expected = r.header;
    expected.src_rank = static_cast<uint32_t>(source);
    problem = compare_headers(expected, h, rank_);
  } else if (h.length != r.length || h.dtype != r.header.dtype) {
    problem = peer_name_(source) + " sent " + describe(h) + " (" + std::to_string(h.length) + " bytes), but rank " +
              std::to_string(rank_) + " posted a receive for " + describe(r.header) + " (" +
              std::to_string(r.length) + " bytes)";
  }
  if (!problem.empty()) throw Error(Error::Kind::kMismatch, "MCCL collective mismatch: " + problem);
}

// The one place an unexpected frame's payload is copied out to its receive.
void Matcher::deliver(Unexpected& u, const RequestPtr& request) {
  if (request->length > 0) std::memcpy(request->data, u.buffer.data(), request->length);
  request->source = u.source;
  recycle(std::move(u.buffer));
  complete(request);
}

void Matcher::post(const RequestPtr& request) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (it->claimed || !matches(*request, it->source, it->header)) continue;
    validate(*request, it->header, it->source);
    if (!it->arrived) {
      it->claimed = request;
      return;
    }
    Unexpected u = std::move(*it);
    unexpected_.erase(it);
    deliver(u, request);
    return;
  }
  posted_.push_back(request);
}

RequestPtr Matcher::claim(int source, const FrameHeader& h) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (!matches(**it, source, h)) continue;
    validate(**it, h, source);
    RequestPtr request = std::move(*it);
    posted_.erase(it);
    request->source = source;
    return request;
  }
  return nullptr;
}

Matcher::Stash Matcher::stash(int source, const FrameHeader& h) {
  Unexpected u;
  u.source = source;
  u.header = h;
  u.buffer = take_buffer(std::min<uint64_t>(h.length, kStashFirstBytes));
  return unexpected_.insert(unexpected_.end(), std::move(u));
}

// The buffer doubles (up to the frame's length) whenever a byte beyond it arrives.
char* Matcher::place(Stash u, uint64_t pos, uint64_t* room) {
  Buffer& buffer = u->buffer;
  if (pos >= buffer.capacity) {
    size_t capacity = buffer.capacity;
    while (capacity <= pos) capacity = std::max<size_t>(capacity * 2, 1);
    Buffer bigger;
    bigger.capacity = std::min<uint64_t>(u->header.length, capacity);
    bigger.bytes.reset(new char[bigger.capacity]);
    if (buffer.capacity > 0) std::memcpy(bigger.data(), buffer.data(), buffer.capacity);
    buffer = std::move(bigger);
  }
  *room = buffer.capacity - pos;
  return buffer.data() + pos;
}

void Matcher::arrived(Stash u) {
  if (!u->claimed) {
    u->arrived = true;
    return;
  }
  RequestPtr request = std::move(u->claimed);
  Unexpected frame = std::move(*u);
  unexpected_.erase(u);
  deliver(frame, request);
}

bool Matcher::waits_for(int source) const {
  return std::any_of(posted_.begin(), posted_.end(), [&](const RequestPtr& r) { return r->peer == source; });
}

void Matcher::check_strays(uint64_t seq) const {
  for (const auto& u : unexpected_) {
    if (u.claimed || u.header.channel != static_cast<uint8_t>(Channel::kCollective) || u.header.seq > seq) continue;
    throw Error(Error::Kind::kMismatch,
                "MCCL collective mismatch: " + peer_name_(u.source) + " sent a frame of " + describe(u.header) +
                    " (step " + std::to_string(u.header.step) + ", " + std::to_string(u.header.length) +
                    " bytes) that rank " + std::to_string(rank_) +
                    " never expected in that collective: the ranks called different collectives, or the same "
                    "one with a different root or size");
  }
}

void Matcher::drop_all(std::vector<RequestPtr>* pending) {
  pending->insert(pending->end(), posted_.begin(), posted_.end());
  for (auto& u : unexpected_) {
    if (u.claimed) pending->push_back(u.claimed);
  }
  posted_.clear();
  unexpected_.clear();
}

Matcher::Buffer Matcher::take_buffer(size_t size) {
  for (auto it = spare_buffers_.begin(); it != spare_buffers_.end(); ++it) {
    if (it->capacity >= size) {
      Buffer found = std::move(*it);
      spare_buffers_.erase(it);
      spare_bytes_ -= found.capacity;
      return found;
    }
  }
  Buffer fresh;
  fresh.capacity = std::max<size_t>(size, 1);
  fresh.bytes.reset(new char[fresh.capacity]);
  return fresh;
}

void Matcher::recycle(Buffer buffer) {
  if (buffer.capacity == 0 || spare_bytes_ + buffer.capacity > kMaxSpareBytes) return;
  spare_bytes_ += buffer.capacity;
  spare_buffers_.push_back(std::move(buffer));
}

}  // namespace mccl
