#include "transport.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "error.h"
#include "log.h"

namespace mccl {

struct Transport::Pair {
  Socket sock;
  int rank = 0;
  int lane = 0;
  std::deque<RequestPtr> sendq;
  size_t offloaded = 0;  // the first `offloaded` frames of sendq are the sender thread's to write
  // Receive state machine: header bytes, then payload into `target` or into `stash`.
  FrameHeader header;
  size_t header_got = 0;
  FrameHeader next_header;  // the start of the next frame, read together with a payload's last bytes
  bool in_payload = false;
  size_t payload_got = 0;
  RequestPtr target;      // the posted receive this payload lands in, or null
  Unexpected stash;       // payload of a frame nobody has asked for yet
  bool closed = false;    // the peer closed its end cleanly, between frames, or sent an abort
  std::shared_ptr<Error> closed_cause;  // the abort it reported, if any
  Clock::time_point last_heard;  // when bytes last arrived from the peer (progress-round resolution)
  Clock::time_point last_sent;   // when bytes last left for the peer
  RequestPtr heartbeat;          // reused; queued only on an empty send queue
};

namespace {
constexpr int kMaxIov = 16;
constexpr size_t kStashFirstBytes = size_t(64) << 20;

}  // namespace

Transport::Transport(int rank, int size, uint64_t comm_id, std::vector<Socket> peers,
                     std::vector<std::string> addresses, uint64_t max_message_bytes, int nsocks, size_t stripe_bytes)
    : rank_(rank), size_(size), comm_id_(comm_id), max_message_bytes_(max_message_bytes),
      addresses_(std::move(addresses)), nsocks_(std::max(nsocks, 1)), stripe_bytes_(std::max<size_t>(stripe_bytes, 1)) {
  make_wake_pipe(&wake_read_, &wake_write_);
  round_start_ = Clock::now();
  next_liveness_check_ = round_start_;
  pairs_.resize(static_cast<size_t>(size) * nsocks_);
  for (size_t i = 0; i < pairs_.size(); ++i) {
    const int r = static_cast<int>(i) / nsocks_;
    if (r == rank || i >= peers.size() || !peers[i].valid()) continue;
    auto pair = std::make_unique<Pair>();
    pair->sock = std::move(peers[i]);
    pair->rank = r;
    pair->lane = static_cast<int>(i) % nsocks_;
    pair->last_heard = pair->last_sent = round_start_;
    pair->heartbeat = std::make_shared<Request>();
    pair->heartbeat->peer = r;
    FrameHeader& h = pair->heartbeat->header;
    h.channel = static_cast<uint8_t>(Channel::kControl);
    h.kind = static_cast<uint8_t>(ControlKind::kHeartbeat);
    h.comm_id = comm_id_;
    h.src_rank = static_cast<uint32_t>(rank_);
    pairs_[i] = std::move(pair);
  }
}

void Transport::set_heartbeat(std::chrono::milliseconds interval, std::chrono::milliseconds timeout) {
  heartbeats_ = timeout.count() > 0 && interval.count() > 0;
  heartbeat_timeout_ = timeout;
  heartbeat_interval_ = std::min<Clock::duration>(interval, timeout / 4);
  if (heartbeat_interval_ < std::chrono::milliseconds(1)) heartbeat_interval_ = std::chrono::milliseconds(1);
  next_liveness_check_ = round_start_;
}

// Sleeps in poll() no longer than the next liveness check. Measured from the last round's clock
// reading, so the hot path reads the clock once per round; at worst it wakes a round's work late.
int Transport::clamp_to_heartbeat(int timeout_ms) const {
  if (!heartbeats_) return timeout_ms;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_liveness_check_ - round_start_).count();
  int cap = left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
  return (timeout_ms < 0 || timeout_ms > cap) ? cap : timeout_ms;
}

// Every half heartbeat period: a peer that sent nothing for the timeout fails the communicator; a peer
// that was sent nothing for the interval gets a heartbeat, but only when its send queue is empty, so
// the heartbeat never lands inside another frame's bytes.
void Transport::check_liveness() {
  if (!heartbeats_ || round_start_ < next_liveness_check_) return;
  next_liveness_check_ = round_start_ + heartbeat_interval_ / 2;
  for (auto& p : pairs_) {
    if (!p || p->closed) continue;
    Pair& pair = *p;
    const auto silent = round_start_ - pair.last_heard;
    if (silent > heartbeat_timeout_) {
      char seconds[32], limit[32];
      std::snprintf(seconds, sizeof(seconds), "%.1f", std::chrono::duration<double>(silent).count());
      std::snprintf(limit, sizeof(limit), "%g", std::chrono::duration<double>(heartbeat_timeout_).count());
      fail_pair(pair, Error(Error::Kind::kTimeout,
                            "MCCL heartbeat timeout: rank " + std::to_string(rank_) + " heard nothing from " +
                                peer_name(pair.rank) + " for " + seconds + " s (MCCL_HEARTBEAT_TIMEOUT=" + limit +
                                ") " + (busy_ ? "during " + context() : std::string("between collectives")) +
                                ": that process is stopped (SIGSTOP, a debugger), its machine is asleep, or the "
                                "network between them is down"));
    }
    if (pair.sendq.empty() && round_start_ - pair.last_sent >= heartbeat_interval_) {
      pair.heartbeat->progress = 0;
      pair.heartbeat->done = false;
      pair.sendq.push_back(pair.heartbeat);
      try {
        write_ready(pair);
      } catch (const Error& e) {
        fail_pair(pair, e);
      }
    }
  }
}

Transport::~Transport() {
  stop_sender();
  drain_before_close();
  ::close(wake_read_);
  ::close(wake_write_);
}

// Closing a socket with unread bytes makes the kernel send a reset, and a reset makes the peer's kernel
// drop what it had received but not yet read: our abort frame. So the sockets are read empty first;
// after a failure, also for a moment longer (bounded), until the peers close their ends too.
void Transport::drain_before_close() {
  const Deadline deadline = Clock::now() + std::chrono::milliseconds(fatal_ ? 100 : 0);
  std::vector<pollfd> fds;
  for (auto& pair : pairs_) {
    if (pair && pair->sock.valid()) fds.push_back({pair->sock.fd(), POLLIN, 0});
  }
  char sink[16384];
  while (!fds.empty()) {
    for (size_t i = 0; i < fds.size();) {
      ssize_t n;
      do n = ::recv(fds[i].fd, sink, sizeof(sink), 0);
      while (n > 0);
      bool open = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
      if (open) ++i;
      else fds.erase(fds.begin() + static_cast<std::ptrdiff_t>(i));  // end of stream or error: done
    }
    int wait_ms = ms_until(deadline, 100);
    if (fds.empty() || wait_ms <= 0 || ::poll(fds.data(), fds.size(), wait_ms) <= 0) break;
  }
}

std::string Transport::peer_name(int rank) const {
  if (rank < 0 || rank >= size_) return "rank " + std::to_string(rank);
  return "rank " + std::to_string(rank) + " (" + addresses_[rank] + ")";
}

void Transport::throw_if_failed() const {
  if (fatal_) std::rethrow_exception(fatal_);
}

void Transport::wake() {
  char byte = 1;
  ssize_t ignored = ::write(wake_write_, &byte, 1);  // a full pipe already means "wake up"
  (void)ignored;
}

RequestPtr Transport::post_send(int peer, const FrameHeader& header, const void* data, size_t length,
                                std::function<void(const Request&, std::exception_ptr)> on_done) {
  throw_if_failed();
  MCCL_CHECK_ARG(peer >= 0 && peer < size_ && peer != rank_, "rank ", rank_, " cannot send to rank ", peer,
                 " (world size ", size_, ")");
  auto request = std::make_shared<Request>();
  request->type = Request::Type::kSend;
  request->peer = peer;
  request->header = header;
  request->header.comm_id = comm_id_;
  request->header.src_rank = static_cast<uint32_t>(rank_);
  request->header.length = length;
  request->data = static_cast<char*>(const_cast<void*>(data));
  request->length = length;
  request->on_done = std::move(on_done);
  request->lane = lane_of(header);
  Pair& pair = pair_for(peer, request->lane);
  if (pair.closed) fail_pair(pair, closed_error(pair));
  if (stats_) stats_->sent(header.kind, length);
  pair.sendq.push_back(request);
  // Nothing queued ahead of it: try to put it on the wire right away. Behind the sender's frames: its turn.
  if (pair.sendq.size() == 1 || pair.offloaded > 0) {
    try {
      write_ready(pair);
    } catch (const Error& e) {
      fail_pair(pair, e);
    }
  }
  return request;
}

RequestPtr Transport::post_recv(int peer, const FrameHeader& expected, void* data, size_t length,
                                std::function<void(const Request&, std::exception_ptr)> on_done) {
  throw_if_failed();
  MCCL_CHECK_ARG(peer == kAnySource || (peer >= 0 && peer < size_ && peer != rank_), "rank ", rank_,
                 " cannot receive from rank ", peer, " (world size ", size_, ")");
  auto request = std::make_shared<Request>();
  request->type = Request::Type::kRecv;
  request->peer = peer;
  request->header = expected;
  request->header.length = length;
  request->data = static_cast<char*>(data);
  request->length = length;
  request->on_done = std::move(on_done);
  request->lane = peer == kAnySource ? 0 : lane_of(expected);
  if (stats_) stats_->received(expected.kind, length);
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (!matches(*request, it->source, it->lane, it->header)) continue;
    validate_match(*request, it->header, it->source);
    if (length > 0) std::memcpy(request->data, it->buffer.data(), length);
    request->source = it->source;
    recycle(std::move(it->buffer));
    unexpected_.erase(it);
    complete(request);
    return request;
  }
  if (peer != kAnySource && pair_for(peer, request->lane).closed) {
    Pair& pair = pair_for(peer, request->lane);
    fail_pair(pair, closed_error(pair));
  }
  posted_recvs_.push_back(request);
  return request;
}

void Transport::check_no_stray_frames(uint64_t seq) {
  for (const auto& u : unexpected_) {
    if (u.header.channel != static_cast<uint8_t>(Channel::kCollective) || u.header.seq > seq) continue;
    Error error(Error::Kind::kMismatch,
                "MCCL collective mismatch: " + peer_name(u.source) + " sent a frame of " + describe(u.header) +
                    " (step " + std::to_string(u.header.step) + ", " + std::to_string(u.header.length) +
                    " bytes) that rank " + std::to_string(rank_) +
                    " never expected in that collective: the ranks called different collectives, or the same "
                    "one with a different root or size");
    fail(std::make_exception_ptr(error));
    throw error;
  }
}

bool Transport::matches(const Request& r, int source, int lane, const FrameHeader& h) const {
  return (r.peer == kAnySource || r.peer == source) && r.lane == lane && r.header.channel == h.channel &&
         r.header.seq == h.seq;
}

// Consecutive pieces of a ring step (offsets a piece apart) and consecutive steps go to different lanes.
// Both ends compute this from the header alone; MCCL_CHUNK_BYTES is the same everywhere (checked when
// connecting). Everything but collective frames uses lane 0, so any-source receives see one lane.
int Transport::lane_of(const FrameHeader& h) const {
  if (nsocks_ == 1 || h.channel != static_cast<uint8_t>(Channel::kCollective)) return 0;
  return static_cast<int>((h.step + h.offset / stripe_bytes_) % static_cast<uint64_t>(nsocks_));
}

// With one lane, a frame of a mismatched collective meets the receive posted in its place, and
// validate_match() names the difference. With several, it may travel on a lane where this rank never
// posts a receive, and would sit there until the timeout. So every collective frame's identity (kind,
// dtype, element count, op, root, wire type) is compared with the collective running here when it
// arrives, or when that collective starts (check_arrived_frames), whichever is later.
void Transport::check_identity(const FrameHeader& h, int source) {
  if (nsocks_ == 1 || !busy_ || h.channel != static_cast<uint8_t>(Channel::kCollective) ||
      context_.channel != h.channel || h.seq != context_.seq)
    return;
  FrameHeader expected = context_;
  expected.src_rank = static_cast<uint32_t>(source);
  expected.offset = h.offset;
  expected.length = h.length;
  expected.step = h.step;
  if (h.kind == static_cast<uint8_t>(CollectiveKind::kAlltoall) && context_.kind == h.kind)
    expected.count = h.count;  // its frames carry per-peer counts (validated when matched)
  std::string problem = compare_headers(expected, h, rank_);
  if (problem.empty()) return;
  Error error(Error::Kind::kMismatch, "MCCL collective mismatch: " + problem);
  fail(std::make_exception_ptr(error));
  throw error;
}

void Transport::check_arrived_frames() {
  if (nsocks_ == 1) return;
  for (const auto& u : unexpected_) check_identity(u.header, u.source);
  for (const auto& pair : pairs_) {
    if (pair && pair->in_payload && !pair->target) check_identity(pair->stash.header, pair->rank);
  }
}

void Transport::validate_match(const Request& r, const FrameHeader& h, int source) {
  std::string problem;
  if (h.channel == static_cast<uint8_t>(Channel::kCollective)) {
    FrameHeader expected = r.header;
    expected.src_rank = static_cast<uint32_t>(source);
    problem = compare_headers(expected, h, rank_);
  } else if (h.length != r.length || h.dtype != r.header.dtype) {
    problem = peer_name(source) + " sent " + describe(h) + " (" + std::to_string(h.length) + " bytes), but rank " +
              std::to_string(rank_) + " posted a receive for " + describe(r.header) + " (" +
              std::to_string(r.length) + " bytes)";
  }
  if (!problem.empty()) {
    Error error(Error::Kind::kMismatch, "MCCL collective mismatch: " + problem);
    fail(std::make_exception_ptr(error));
    throw error;
  }
}

void Transport::complete(const RequestPtr& request) {
  request->done = true;
  if (request->on_done) {
    auto callback = std::move(request->on_done);
    request->on_done = nullptr;
    callback(*request, nullptr);
  }
}

// Waiting polls without sleeping (yielding the CPU between rounds) for up to spin_ first: on a
// low-latency link the peer's frame usually comes sooner than a sleeping thread could be woken for it.
void Transport::wait(const RequestPtr& request, Deadline deadline) { wait_all({request}, deadline); }

void Transport::wait_all(const std::vector<RequestPtr>& requests, Deadline deadline) {
  const Deadline spin_until = spin_.count() > 0 ? Clock::now() + spin_ : Deadline{};
  for (const auto& request : requests) {
    while (!request->done) {
      throw_if_failed();
      const auto now = Clock::now();
      if (now >= deadline) timeout(requests);
      if (now < spin_until) {
        progress(0);
        if (!request->done) std::this_thread::yield();
      } else {
        progress(ms_until(deadline, 1000));
      }
    }
  }
}

void Transport::timeout(const std::vector<RequestPtr>& pending) {
  std::string what;
  int listed = 0;
  for (const auto& r : pending) {
    if (r->done || listed == 3) continue;
    what += listed++ ? "; " : "";
    if (r->type == Request::Type::kSend) what += "sending to " + peer_name(r->peer);
    else what += "a message from " + (r->peer == kAnySource ? std::string("any rank") : peer_name(r->peer));
  }
  Error error(Error::Kind::kTimeout, "MCCL timeout: rank " + std::to_string(rank_) + " timed out in " + context() +
                                         " waiting for " + what +
                                         ". That peer is stopped, hung, or not calling the same collective.");
  fail(std::make_exception_ptr(error));
  throw error;
}

void Transport::progress(int timeout_ms) {
  throw_if_failed();
  std::vector<pollfd>& fds = poll_fds_;  // reused: no allocation per round
  std::vector<Pair*>& owners = poll_owners_;
  fds.clear();
  owners.clear();
  fds.push_back({wake_read_, POLLIN, 0});
  owners.push_back(nullptr);
  for (auto& pair : pairs_) {
    if (!pair || pair->closed) continue;
    short events = POLLIN;
    if (pair->sendq.size() > pair->offloaded) events |= POLLOUT;
    fds.push_back({pair->sock.fd(), events, 0});
    owners.push_back(pair.get());
  }
  int ready = ::poll(fds.data(), fds.size(), clamp_to_heartbeat(timeout_ms));
  round_start_ = Clock::now();
  if (ready < 0) {
    if (errno != EINTR) mccl::fail(Error::Kind::kInternal, "poll failed: ", std::strerror(errno));
    ready = 0;
  }
  if (sender_news()) retire_sent();
  if (ready == 0) {
    check_liveness();
    return;
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    Pair& pair = *owners[i];
    try {
      if (fds[i].revents & POLLOUT) write_ready(pair);
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_ready(pair);
    } catch (const Error& e) {
      fail_pair(pair, e);
    }
  }
  if (fds[0].revents & POLLIN) {
    char buf[64];
    while (::read(wake_read_, buf, sizeof(buf)) > 0) {
    }
    if (on_wakeup_) on_wakeup_();
  }
  check_liveness();
}

// Writes as much of the send queue as the socket takes: header and payload of up to kMaxIov/2
// queued frames go out in one sendmsg(). With a sender thread, a large frame at the front goes to it,
// with everything queued behind it; small frames ahead of it are written here first.
void Transport::write_ready(Pair& pair) {
  if (pair.offloaded > 0) return hand_over(pair);
  while (!pair.sendq.empty()) {
    const Request& front = *pair.sendq.front();
    if (!senders_.empty() && front.length >= send_thread_bytes_) return hand_over(pair);
    iovec iov[kMaxIov];
    int count = 0;
    for (auto it = pair.sendq.begin(); it != pair.sendq.end() && count + 2 <= kMaxIov; ++it) {
      Request& r = **it;
      if (!senders_.empty() && r.length >= send_thread_bytes_ && it != pair.sendq.begin()) break;
      size_t offset = r.progress;
      if (offset < sizeof(FrameHeader)) {
        iov[count++] = {reinterpret_cast<char*>(&r.header) + offset, sizeof(FrameHeader) - offset};
        offset = sizeof(FrameHeader);
      }
      size_t payload_done = offset - sizeof(FrameHeader);
      if (payload_done < r.length) iov[count++] = {r.data + payload_done, r.length - payload_done};
    }
    size_t written = pair.sock.send_some(iov, count);
    if (written == 0) return;
    pair.last_sent = round_start_;
    while (written > 0) {
      Request& r = *pair.sendq.front();
      size_t left = sizeof(FrameHeader) + r.length - r.progress;
      size_t take = std::min(left, written);
      r.progress += take;
      written -= take;
      if (r.progress == sizeof(FrameHeader) + r.length) {
        RequestPtr finished = pair.sendq.front();
        pair.sendq.pop_front();
        complete(finished);
      }
    }
  }
}

void Transport::set_send_thread(size_t min_bytes) {
  send_thread_bytes_ = min_bytes;
  if (min_bytes == 0 || size_ == 1 || !senders_.empty()) return;
  for (int lane = 0; lane < nsocks_; ++lane) senders_.push_back(std::make_unique<Sender>(size_, [this] { wake(); }, spin_));
}

// Gives the pair's sender every frame of its queue it does not hold yet.
void Transport::hand_over(Pair& pair) {
  Sender& sender = *senders_[pair.lane];
  for (size_t i = pair.offloaded; i < pair.sendq.size(); ++i) sender.submit(pair.rank, pair.sock.fd(), pair.sendq[i]);
  pair.offloaded = pair.sendq.size();
}

bool Transport::sender_news() const {
  for (const auto& sender : senders_) {
    if (sender->has_news()) return true;
  }
  return false;
}

// The senders finished frames (they complete here, on the progress thread) or hit a socket error.
void Transport::retire_sent() {
  for (int lane = 0; lane < static_cast<int>(senders_.size()); ++lane) {
    if (!senders_[lane]->has_news()) continue;
    sent_reports_.clear();
    senders_[lane]->collect(&sent_reports_);
    for (int rank = 0; rank < static_cast<int>(sent_reports_.size()); ++rank) {
      const Sender::Report& report = sent_reports_[rank];
      if (report.finished == 0 && report.error.empty()) continue;
      Pair& pair = pair_for(rank, lane);
      if (report.finished > 0) pair.last_sent = round_start_;
      for (size_t k = 0; k < report.finished; ++k) {
        RequestPtr finished = std::move(pair.sendq.front());
        pair.sendq.pop_front();
        --pair.offloaded;
        finished->progress = sizeof(FrameHeader) + finished->length;
        complete(finished);
      }
      if (!report.error.empty()) fail_pair(pair, Error(Error::Kind::kConnection, report.error));
    }
  }
}

// Before the transport writes to a socket itself again (an abort frame) or frees what a sender may
// still be reading: the senders stop, the frames they finished complete, and the first unfinished
// frame of each pair records how much of it went out, so send_abort() can finish it.
void Transport::stop_sender() {
  std::vector<size_t> head_progress;
  for (int lane = 0; lane < static_cast<int>(senders_.size()); ++lane) {
    senders_[lane]->stop(&head_progress);
    sent_reports_.clear();
    senders_[lane]->collect(&sent_reports_);
    for (int rank = 0; rank < size_; ++rank) {
      if (!pairs_[static_cast<size_t>(rank) * nsocks_ + lane]) continue;
      Pair& pair = pair_for(rank, lane);
      for (size_t k = 0; k < sent_reports_[rank].finished; ++k) {
        RequestPtr finished = std::move(pair.sendq.front());
        pair.sendq.pop_front();
        finished->progress = sizeof(FrameHeader) + finished->length;
        complete(finished);
      }
      if (pair.offloaded > 0 && !pair.sendq.empty()) pair.sendq.front()->progress = head_progress[rank];
      pair.offloaded = 0;
    }
  }
  senders_.clear();
}

// A read that returns less than it asked for means the socket is drained: back to poll() rather than
// paying for a read that would only say EAGAIN. The read that ends a payload also asks for the next
// frame's header, so a stream of small frames costs about one read each.
void Transport::read_ready(Pair& pair) {
  while (!pair.closed) {
    if (!pair.in_payload) {
      size_t n;
      try {
        n = pair.sock.recv_some(reinterpret_cast<char*>(&pair.header) + pair.header_got,
                                sizeof(FrameHeader) - pair.header_got);
      } catch (const Error& e) {
        if (pair.header_got != 0 || e.kind() != Error::Kind::kConnection) throw;
        on_peer_closed(pair, e);
        return;
      }
      if (n == 0) return;
      pair.last_heard = round_start_;
      pair.header_got += n;
      if (pair.header_got < sizeof(FrameHeader)) return;
      on_header(pair);
      if (fatal_) return;
      continue;
    }
    size_t want = pair.header.length - pair.payload_got;
    if (!pair.target) {
      if (pair.payload_got == pair.stash.buffer.capacity) grow_stash(pair);
      want = std::min(want, pair.stash.buffer.capacity - pair.payload_got);
    }
    char* dest = pair.target ? pair.target->data : pair.stash.buffer.data();
    const bool ends_payload = pair.payload_got + want == pair.header.length;
    const iovec iov[2] = {{dest + pair.payload_got, want}, {&pair.next_header, sizeof(FrameHeader)}};
    const size_t asked = want + (ends_payload ? sizeof(FrameHeader) : 0);
    const size_t n = pair.sock.recv_some(iov, ends_payload ? 2 : 1);
    if (n == 0) return;
    pair.last_heard = round_start_;
    pair.payload_got += std::min(n, want);
    if (pair.payload_got == pair.header.length) {
      pair.in_payload = false;
      deliver(pair);
      if (n > want) {  // the next frame's header, in part or whole
        std::memcpy(&pair.header, &pair.next_header, n - want);
        pair.header_got = n - want;
        if (pair.header_got < sizeof(FrameHeader) || pair.closed) return;
        on_header(pair);
        if (fatal_) return;
      }
    }
    if (n < asked) return;
  }
}

// A whole header is in: check it before anything else, then find where its payload goes.
void Transport::on_header(Pair& pair) {
  const FrameHeader& h = pair.header;
  pair.header_got = 0;
  std::string bad = check_frame_header(h, comm_id_, pair.rank, max_message_bytes_);
  if (!bad.empty()) mccl::fail(Error::Kind::kProtocol, "from ", peer_name(pair.rank), ": ", bad);
  // A heartbeat has done its job by arriving (last_heard is updated); it matches nothing.
  if (h.channel == static_cast<uint8_t>(Channel::kControl) && h.kind == static_cast<uint8_t>(ControlKind::kHeartbeat))
    return;

  check_identity(h, pair.rank);
  pair.target = nullptr;
  for (auto it = posted_recvs_.begin(); it != posted_recvs_.end(); ++it) {
    if (!matches(**it, pair.rank, pair.lane, h)) continue;
    validate_match(**it, h, pair.rank);
    pair.target = *it;
    pair.target->source = pair.rank;
    posted_recvs_.erase(it);
    break;
  }
  pair.payload_got = 0;
  if (!pair.target) {
    pair.stash.source = pair.rank;
    pair.stash.lane = pair.lane;
    pair.stash.header = h;
    pair.stash.buffer = take_buffer(std::min<uint64_t>(h.length, kStashFirstBytes));
  }
  if (h.length > 0) pair.in_payload = true;
  else deliver(pair);
}

// A frame is complete: in the receive it matched, or in the pair's stash.
void Transport::deliver(Pair& pair) {
  if (pair.target) {
    RequestPtr done = std::move(pair.target);
    pair.target = nullptr;
    complete(done);
  } else {
    finish_unexpected(pair);
  }
}

// A peer's abort: adopt its error (its kind, its words) as ours, saying who detected it.
void Transport::on_control(Pair& pair) {
  const Unexpected& u = pair.stash;
  std::string text(u.buffer.data(), u.header.length);
  // Printable text only: a NUL would cut the message short for C-string readers (Python), and escape
  // sequences have no business in our logs.
  for (char& c : text) {
    if ((static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') || c == 0x7f) c = '?';
  }
  if (u.header.kind != static_cast<uint8_t>(ControlKind::kAbort) ||
      u.header.count > static_cast<uint64_t>(Error::Kind::kInternal))
    mccl::fail(Error::Kind::kProtocol, "from ", peer_name(pair.rank), ": unknown control frame");
  const int kind = static_cast<int>(u.header.count);
  Error error(static_cast<Error::Kind>(kind), text + " [reported by " + peer_name(pair.rank) +
                                                  ", which stopped this communicator]");
  // Like a close that carries its cause: fatal now if this rank is waiting on that peer, else at the
  // first operation that needs it. Frames it sent before the abort are still delivered.
  pair.closed_cause = std::make_shared<Error>(error);
  recycle(std::move(pair.stash.buffer));
  pair.stash = Unexpected{};
  on_peer_closed(pair, error);
}

Error Transport::closed_error(const Pair& pair) const {
  if (pair.closed_cause) return *pair.closed_cause;
  return Error(Error::Kind::kConnection, "Connection closed by peer");
}

// Best effort, bounded: tells each peer why this rank is giving up, on a frame boundary (a frame that is
// half sent is finished first).
void Transport::send_abort(const std::exception_ptr& error) {
  std::string text = "unknown error";
  uint64_t kind = static_cast<uint64_t>(Error::Kind::kInternal);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    text = e.what();
    kind = static_cast<uint64_t>(e.kind());
  } catch (const std::exception& e) {
    text = e.what();
  } catch (...) {
  }
  if (text.size() > kMaxControlPayload) text.resize(kMaxControlPayload);
  FrameHeader h;
  h.channel = static_cast<uint8_t>(Channel::kControl);
  h.kind = static_cast<uint8_t>(ControlKind::kAbort);
  h.comm_id = comm_id_;
  h.src_rank = static_cast<uint32_t>(rank_);
  h.count = kind;
  h.length = text.size();
  const Deadline deadline = Clock::now() + std::chrono::milliseconds(200);
  for (auto& pair : pairs_) {
    if (!pair || pair->closed) continue;
    try {
      if (!pair->sendq.empty() && pair->sendq.front()->progress != 0) {
        // Mid-frame: finish that frame first (its buffer is still valid), so the abort lands on a boundary.
        const Request& r = *pair->sendq.front();
        const size_t header_left = r.progress < sizeof(FrameHeader) ? sizeof(FrameHeader) - r.progress : 0;
        const size_t payload_done = r.progress - (sizeof(FrameHeader) - header_left);
        pair->sock.write_all(reinterpret_cast<const char*>(&r.header) + (sizeof(FrameHeader) - header_left),
                             header_left, deadline, peer_name(pair->rank));
        pair->sock.write_all(r.data + payload_done, r.length - payload_done, deadline, peer_name(pair->rank));
      }
      pair->sock.write_all(&h, sizeof(h), deadline, peer_name(pair->rank));
      pair->sock.write_all(text.data(), text.size(), deadline, peer_name(pair->rank));
    } catch (const Error&) {
      // The peer is gone or stuck; the closed socket tells it enough.
    }
  }
}

// An unexpected frame's buffer starts at kStashFirstBytes and doubles as its payload arrives, so a
// header claiming a huge length commits memory only for bytes that really came.
void Transport::grow_stash(Pair& pair) {
  Buffer& old = pair.stash.buffer;
  Buffer bigger;
  bigger.capacity = std::min<uint64_t>(pair.header.length, std::max<size_t>(old.capacity * 2, 1));
  bigger.bytes.reset(new char[bigger.capacity]);
  std::memcpy(bigger.data(), old.data(), pair.payload_got);
  old = std::move(bigger);
}

Transport::Buffer Transport::take_buffer(size_t size) {
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

void Transport::recycle(Buffer buffer) {
  constexpr size_t kMaxSpareBytes = size_t(8) << 20;  // kept for reuse, all spare buffers together
  if (buffer.capacity == 0 || spare_bytes_ + buffer.capacity > kMaxSpareBytes) return;
  spare_bytes_ += buffer.capacity;
  spare_buffers_.push_back(std::move(buffer));
}

// The peer closed its end between two frames: normal when it is done with this communicator (it shut
// down or exited after its last collective). An error only if we still need it: a receive posted from
// it, or frames still queued for it; later posts involving it fail in post_send / post_recv.
// Frames the sender thread holds do not count: it may have written them (the peer read them and
// left) without having reported it yet; if not, its write fails and it reports that.
void Transport::on_peer_closed(Pair& pair, const Error& cause) {
  pair.closed = true;
  bool needed = pair.sendq.size() > pair.offloaded;
  for (const auto& r : posted_recvs_) needed = needed || (r->peer == pair.rank && r->lane == pair.lane);
  if (needed) fail_pair(pair, pair.closed_cause ? *pair.closed_cause : cause);
  log(LogLevel::kInfo, "rank ", rank_, ": ", peer_name(pair.rank), " closed its connection");
}

// A frame nobody had asked for is complete. A receive may have been posted while its payload was
// still arriving; give it to that one, else keep it.
void Transport::finish_unexpected(Pair& pair) {
  Unexpected& u = pair.stash;
  if (u.header.channel == static_cast<uint8_t>(Channel::kControl)) return on_control(pair);
  for (auto it = posted_recvs_.begin(); it != posted_recvs_.end(); ++it) {
    if (!matches(**it, u.source, u.lane, u.header)) continue;
    RequestPtr request = *it;
    validate_match(*request, u.header, u.source);
    posted_recvs_.erase(it);
    if (request->length > 0) std::memcpy(request->data, u.buffer.data(), request->length);
    request->source = u.source;
    recycle(std::move(u.buffer));
    complete(request);
    return;
  }
  unexpected_.push_back(std::move(u));
  pair.stash = Unexpected{};
}

void Transport::fail_pair(const Pair& pair, const Error& cause) {
  if (fatal_) std::rethrow_exception(fatal_);
  Error::Kind kind = cause.kind();
  std::string message = cause.what();
  if (kind == Error::Kind::kConnection) {
    message = "MCCL connection error: rank " + std::to_string(rank_) + " lost its connection to " +
              peer_name(pair.rank) + " during " + context() + " (" + cause.what() +
              "). That process probably exited or crashed: look at its log for the first error.";
  }
  Error error(kind, message);
  fail(std::make_exception_ptr(error));
  throw error;
}

void Transport::fail(std::exception_ptr error, bool notify_peers) {
  if (fatal_) return;
  fatal_ = error;
  stop_sender();
  if (notify_peers) send_abort(error);
  for (auto& pair : pairs_) {
    if (pair) pair->sock.shutdown_write();  // the peers read our abort, then end of stream
  }
  std::vector<RequestPtr> pending(posted_recvs_.begin(), posted_recvs_.end());
  for (auto& pair : pairs_) {
    if (!pair) continue;
    pending.insert(pending.end(), pair->sendq.begin(), pair->sendq.end());
    if (pair->target) pending.push_back(pair->target);
    pair->sendq.clear();
    pair->target = nullptr;
  }
  posted_recvs_.clear();
  unexpected_.clear();
  for (auto& request : pending) {
    if (request->on_done) {
      auto callback = std::move(request->on_done);
      request->on_done = nullptr;
      callback(*request, error);
    }
  }
}

}  // namespace mccl
