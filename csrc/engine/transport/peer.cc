#include "transport/peer.h"

#include <algorithm>
#include <cstring>

#include "log.h"

namespace mccl {

LaneHeader lane_header(const FrameHeader& h, int lane, uint64_t offset) {
  LaneHeader l;
  l.channel = h.channel;
  l.lane = static_cast<uint8_t>(lane);
  l.src_rank = h.src_rank;
  l.seq = h.seq;
  l.offset = offset;
  return l;
}

Span lane_span(const FrameHeader& h, int nsocks, int lane) {
  const uint64_t length = h.length;
  uint64_t shares = 1;
  if (nsocks > 1 && h.channel != static_cast<uint8_t>(Channel::kControl))
    shares = std::clamp<uint64_t>(length / kMinShareBytes, 1, static_cast<uint64_t>(nsocks));
  const uint64_t share = ((length + shares - 1) / shares + 63) / 64 * 64;  // whole cache lines
  const uint64_t begin = std::min(length, share * static_cast<uint64_t>(lane));
  return Span{begin, std::min(length, begin + share)};
}

Peer::Peer(int rank, std::string name, std::vector<Socket> lanes, const Context& context, Clock::time_point now)
    : rank_(rank), name_(std::move(name)), context_(context), lanes_(lanes.size()), last_heard_(now), last_sent_(now) {
  for (size_t i = 0; i < lanes.size(); ++i) lanes_[i].sock = std::move(lanes[i]);
  heartbeat_ = std::make_shared<Request>();
  heartbeat_->peer = rank;
  FrameHeader& h = heartbeat_->header;
  h.channel = static_cast<uint8_t>(Channel::kControl);
  h.kind = static_cast<uint8_t>(ControlKind::kHeartbeat);
  h.comm_id = context.comm_id;
  h.src_rank = static_cast<uint32_t>(context.my_rank);
}

Error Peer::closed_error() const {
  if (closed_cause_) return *closed_cause_;
  return Error(Error::Kind::kConnection, "Connection closed by peer");
}

bool Peer::wants_read(int lane) const {
  return lane == 0 ? !ended_ : lanes_[lane].in_share || !lanes_[lane].due.empty();
}

// ---- sending ------------------------------------------------------------------------------------

// All segments are queued (and counted in parts_left) before any is written, so the frame completes
// only when the last of them is out. A lane whose queue was empty (or held by its sender) writes now.
void Peer::post(const RequestPtr& request, Clock::time_point now) {
  if (closed_) throw closed_error();
  const int n = lanes();
  int touched = 0;
  for (int lane = 0; lane < n; ++lane) {
    const Span span = lane_span(request->header, n, lane);
    if (lane > 0 && span.size() == 0) break;  // shares are consecutive from lane 0
    FrameCursor s;
    s.request = request;
    s.frame_head = lane == 0;
    if (lane > 0) s.lane_header = lane_header(request->header, lane, span.begin);
    s.data = request->data ? request->data + span.begin : nullptr;
    s.bytes = span.size();
    lanes_[lane].sendq.push_back(std::move(s));
    ++touched;
  }
  request->parts_left = touched;
  for (int lane = 0; lane < touched; ++lane) {
    if (lanes_[lane].sendq.size() == 1 || lanes_[lane].offloaded > 0) write(lane, now);
  }
}

void Peer::heartbeat(Clock::time_point now) {
  for (const Lane& lane : lanes_) {
    if (!lane.sendq.empty()) return;
  }
  heartbeat_->done = false;
  post(heartbeat_, now);
}

// As much of the queue as the socket takes, up to kMaxIov/2 segments per sendmsg(). With a sender, a large
// frame's segment at the front goes to it, with everything queued behind; smaller ones ahead of it are
// written here first.
void Peer::write(int index, Clock::time_point now) {
  Lane& lane = lanes_[index];
  const Sender* sender = context_.threads->of(index);
  const size_t min_bytes = context_.threads->min_bytes;
  auto big = [&](const FrameCursor& s) { return sender && s.request->length >= min_bytes; };
  if (lane.offloaded > 0) return hand_over(index);
  while (!lane.sendq.empty()) {
    if (big(lane.sendq.front())) return hand_over(index);
    auto last = lane.sendq.begin() + 1;
    while (last != lane.sendq.end() && last - lane.sendq.begin() < kMaxIov / 2 && !big(*last)) ++last;
    iovec iov[kMaxIov];
    const size_t written = lane.sock.send_some(iov, gather(lane.sendq.begin(), last, iov));
    if (written == 0) return;
    retire(index, advance(lane.sendq.begin(), written), now);
  }
}

void Peer::hand_over(int index) {
  Lane& lane = lanes_[index];
  Sender* sender = context_.threads->of(index);
  for (size_t i = lane.offloaded; i < lane.sendq.size(); ++i) sender->submit(rank_, lane.sock.fd(), lane.sendq[i]);
  lane.offloaded = lane.sendq.size();
}

// The one place a written segment leaves its queue; the frame completes with its last segment.
void Peer::retire(int index, size_t n, Clock::time_point now) {
  Lane& lane = lanes_[index];
  if (n > 0) last_sent_ = now;
  lane.offloaded -= std::min(lane.offloaded, n);
  for (size_t k = 0; k < n; ++k) {
    RequestPtr request = std::move(lane.sendq.front().request);
    lane.sendq.pop_front();
    if (--request->parts_left == 0) complete(request);
  }
}

void Peer::take_back(int index, size_t progress) {
  Lane& lane = lanes_[index];
  if (lane.offloaded > 0 && !lane.sendq.empty()) lane.sendq.front().progress = progress;
  lane.offloaded = 0;
}

void Peer::write_abort(FrameCursor abort, Deadline deadline) {
  for (Lane& lane : lanes_) {
    if (!lane.sendq.empty() && lane.sendq.front().progress != 0) write_rest(lane.sock, lane.sendq.front(), deadline, name_);
  }
  write_rest(lanes_[0].sock, abort, deadline, name_);
}

void Peer::shutdown_write() {
  for (Lane& lane : lanes_) lane.sock.shutdown_write();
}

void Peer::drop_all(std::vector<RequestPtr>* pending) {
  for (Lane& lane : lanes_) {
    for (const FrameCursor& s : lane.sendq) pending->push_back(s.request);
    lane.sendq.clear();
    lane.offloaded = 0;
    lane.due.clear();
    lane.in_share = false;
  }
  for (const Frame& f : arriving_) {
    if (f.target) pending->push_back(f.target);
  }
  arriving_.clear();
}

// ---- receiving ----------------------------------------------------------------------------------

// One loop for every lane: a head (lane 0: a FrameHeader, else a LaneHeader), then the share's bytes. A
// read that returns less than it asked for means the socket is drained: back to poll() rather than paying
// for a read that would only say EAGAIN. The read that ends a share also asks for the next head, so a
// stream of small frames costs about one read each.
void Peer::read(int index, Clock::time_point now) {
  Lane& lane = lanes_[index];
  const size_t head_size = index == 0 ? sizeof(FrameHeader) : sizeof(LaneHeader);
  while (!closed_) {
    if (!lane.in_share) {
      if (lane.head_got < head_size) {
        size_t n;
        try {
          n = lane.sock.recv_some(lane.head + lane.head_got, head_size - lane.head_got);
        } catch (const Error& e) {
          if (index != 0 || lane.head_got != 0 || e.kind() != Error::Kind::kConnection) throw;
          return on_end_of_stream(e);  // between frames
        }
        if (n == 0) return;
        last_heard_ = now;
        lane.head_got += n;
        if (lane.head_got < head_size) return;
      }
      if (index == 0) {
        lane.head_got = 0;
        on_frame_header();
      } else {
        if (lane.due.empty()) return;  // the next share's head, early: its frame's header is still to come
        lane.head_got = 0;
        start_share(index);
      }
      continue;
    }
    const uint64_t pos = lane.share.span.begin + lane.got;
    uint64_t room;
    char* dest = place(*lane.share.frame, pos, &room);
    const uint64_t want = std::min(lane.share.span.end - pos, room);
    const bool ends = pos + want == lane.share.span.end;
    const iovec iov[2] = {{dest, want}, {lane.next, head_size}};
    const size_t asked = want + (ends ? head_size : 0);
    const size_t n = lane.sock.recv_some(iov, ends ? 2 : 1);
    if (n == 0) return;
    last_heard_ = now;
    lane.got += std::min<uint64_t>(n, want);
    if (n >= want && ends) {
      lane.in_share = false;
      std::memcpy(lane.head, lane.next, n - want);
      lane.head_got = n - want;
      finish_share(lane.share);
    }
    if (n < asked) return;
  }
}

// A whole frame header is in (lane 0): check it before anything else, find where its payload goes, and
// tell the other lanes which share of it they carry.
void Peer::on_frame_header() {
  FrameHeader h;
  std::memcpy(&h, lanes_[0].head, sizeof(h));
  std::string bad = check_frame_header(h, context_.comm_id, rank_, context_.max_message_bytes);
  if (!bad.empty()) fail(Error::Kind::kProtocol, "from ", name_, ": ", bad);
  // A heartbeat has done its job by arriving (last_heard is updated); it matches nothing.
  if (h.channel == static_cast<uint8_t>(Channel::kControl) && h.kind == static_cast<uint8_t>(ControlKind::kHeartbeat))
    return;
  if (spare_frames_.empty()) spare_frames_.emplace_back();
  arriving_.splice(arriving_.end(), spare_frames_, spare_frames_.begin());
  const FrameIt it = std::prev(arriving_.end());
  Frame& f = *it;
  f = Frame{};
  f.header = h;
  if (h.channel == static_cast<uint8_t>(Channel::kControl)) {
    f.control = true;
    control_.resize(h.length);
  } else if (!(f.target = context_.matcher->claim(rank_, h))) {
    f.stashed = true;
    f.stash = context_.matcher->stash(rank_, h);
  }
  const int n = lanes();
  for (int lane = 0; lane < n; ++lane) {
    const Span span = lane_span(h, n, lane);
    if (span.size() == 0) continue;
    ++f.shares_left;
    if (lane == 0) {
      lanes_[0].share = Share{it, span};
      lanes_[0].got = 0;
      lanes_[0].in_share = true;
    } else {
      lanes_[lane].due.push_back(Share{it, span});
    }
  }
  if (f.shares_left == 0) finish_frame(it);
}

// A lane above 0 has the head of its next share: it must be the one lane 0's header announced.
void Peer::start_share(int index) {
  Lane& lane = lanes_[index];
  Share share = lane.due.front();
  lane.due.pop_front();
  LaneHeader got;
  std::memcpy(&got, lane.head, sizeof(got));
  const LaneHeader want = lane_header(share.frame->header, index, share.span.begin);
  if (std::memcmp(&got, &want, sizeof(got)) != 0) {
    std::string why = check_preamble(got.magic, got.version);
    if (why.empty())
      why = "it carried the share at offset " + std::to_string(got.offset) + " of seq " + std::to_string(got.seq) +
            " (lane " + std::to_string(got.lane) + ") where the share at offset " + std::to_string(want.offset) +
            " of " + describe(share.frame->header) + " was due";
    fail(Error::Kind::kProtocol, "from ", name_, ": lane ", index, " is out of step: ", why);
  }
  lane.share = share;
  lane.got = 0;
  lane.in_share = true;
}

void Peer::finish_share(const Share& share) {
  if (--share.frame->shares_left == 0) finish_frame(share.frame);
}

// Every share of the frame is in: to its receive, to the matcher, or (an abort) to on_control. The list
// node is recycled first, so nothing below sees the frame as still arriving.
void Peer::finish_frame(FrameIt it) {
  Frame f = std::move(*it);
  spare_frames_.splice(spare_frames_.end(), arriving_, it);
  if (f.control) return on_control(f.header);
  if (f.stashed) context_.matcher->arrived(f.stash);
  else complete(f.target);
  if (ended_ && arriving_.empty()) on_closed(*ended_);  // the last share after lane 0's end of stream
}

char* Peer::place(Frame& frame, uint64_t pos, uint64_t* room) {
  if (frame.stashed) return context_.matcher->place(frame.stash, pos, room);
  char* base = frame.control ? control_.data() : frame.target->data;
  *room = (frame.control ? control_.size() : frame.target->length) - pos;
  return base + pos;
}

// A peer's abort: adopt its error (its kind, its words) as ours, saying who detected it.
void Peer::on_control(const FrameHeader& h) {
  std::string text(control_.data(), h.length);
  // Printable text only: a NUL would cut the message short for C-string readers (Python), and escape
  // sequences have no business in our logs.
  for (char& c : text) {
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') || c == 0x7f) c = '?';
  }
  if (h.kind != static_cast<uint8_t>(ControlKind::kAbort) || h.count > static_cast<uint64_t>(Error::Kind::kInternal))
    fail(Error::Kind::kProtocol, "from ", name_, ": unknown control frame");
  Error error(static_cast<Error::Kind>(h.count), text + " [reported by " + name_ + ", which stopped this communicator]");
  // Like a close that carries its cause: fatal now if this rank is waiting on that peer, else at the
  // first operation that needs it. Frames it sent before the abort are still delivered.
  closed_cause_ = std::make_shared<Error>(error);
  on_closed(error);
}

// Lane 0 reached its end of stream between two frames: the peer sends no more frames. Shares of frames
// whose header came already may still be on their way on the other lanes (each lane is a TCP stream of
// its own, so lane 0's end can be read first); the peer is closed once they are in (finish_frame).
void Peer::on_end_of_stream(const Error& cause) {
  if (arriving_.empty()) return on_closed(cause);
  ended_ = std::make_shared<Error>(cause);
}

// The peer closed its end between two frames: normal when it is done with this communicator (it shut
// down or exited after its last collective). An error only if we still need it: a receive posted from
// it, a frame of it still arriving, or segments still queued for it; later posts involving it fail.
// Segments a sender holds do not count: it may have written them (the peer read them and left) without
// having reported it yet; if not, its write fails and it reports that.
void Peer::on_closed(const Error& cause) {
  closed_ = true;
  bool needed = !arriving_.empty() || context_.matcher->waits_for(rank_);
  for (const Lane& lane : lanes_) needed = needed || lane.sendq.size() > lane.offloaded;
  if (needed) throw closed_cause_ ? *closed_cause_ : cause;
  log(LogLevel::kInfo, "rank ", context_.my_rank, ": ", name_, " closed its connection");
}

}  // namespace mccl
