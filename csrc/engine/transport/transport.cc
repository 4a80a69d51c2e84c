#include "transport/transport.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mccl {

Transport::Transport(int rank, int size, uint64_t comm_id, std::vector<Socket> peers,
                     std::vector<std::string> addresses, uint64_t max_message_bytes, int nsocks)
    : rank_(rank), size_(size), comm_id_(comm_id), nsocks_(std::max(nsocks, 1)), addresses_(std::move(addresses)),
      matcher_(rank, [this](int r) { return peer_name(r); }) {
  make_wake_pipe(&wake_read_, &wake_write_);
  round_start_ = Clock::now();
  const Peer::Context context{rank, comm_id, max_message_bytes, &matcher_, &threads_};
  peers_.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::vector<Socket> lanes;
    for (int lane = 0; lane < nsocks_; ++lane) {
      const size_t i = static_cast<size_t>(r) * nsocks_ + lane;
      if (i < peers.size() && peers[i].valid()) lanes.push_back(std::move(peers[i]));
    }
    if (r == rank || lanes.size() != static_cast<size_t>(nsocks_)) continue;
    peers_[r] = std::make_unique<Peer>(r, peer_name(r), std::move(lanes), context, round_start_);
  }
}

Transport::~Transport() {
  stop_sender();
  drain_before_close();
  ::close(wake_read_);
  ::close(wake_write_);
}

std::string Transport::peer_name(int rank) const {
  if (rank < 0 || rank >= size_) return "rank " + std::to_string(rank);
  return "rank " + std::to_string(rank) + " (" + addresses_[rank] + ")";
}

void Transport::throw_if_failed() const {
  if (fatal_) std::rethrow_exception(fatal_);
}

void Transport::wake() { write_wake_pipe(wake_write_); }

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
  if (stats_) stats_->sent(header.kind, length);
  Peer& p = *peers_[peer];
  try {
    p.post(request, round_start_);
  } catch (const Error& e) {
    fail_peer(p, e);
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
  if (stats_) stats_->received(expected.kind, length);
  try {
    matcher_.post(request);
  } catch (const Error& e) {
    fail_and_throw(e);
  }
  // Frames that arrived before the peer closed are still delivered; a receive that must wait for it fails.
  if (!request->done && peer != kAnySource && peers_[peer]->closed()) fail_peer(*peers_[peer], peers_[peer]->closed_error());
  return request;
}

void Transport::check_no_stray_frames(uint64_t seq) {
  try {
    matcher_.check_strays(seq);
  } catch (const Error& e) {
    fail_and_throw(e);
  }
}

void Transport::set_spin(bool adaptive, std::chrono::microseconds fixed) {
  spin_adaptive_ = adaptive;
  spin_fixed_ = fixed;
  spin_ = std::make_unique<SpinPolicy>(adaptive, fixed, SpinPolicy::Site::kProgress);
}

// Waiting polls without sleeping (yielding the CPU between rounds) first, as spin_ says (spin.h): on a
// low-latency link the peer's frame usually comes sooner than a sleeping thread could be woken for it.
void Transport::wait(const RequestPtr& request, Deadline deadline) { wait_all({request}, deadline); }

void Transport::wait_all(const std::vector<RequestPtr>& requests, Deadline deadline) {
  SpinPolicy::Wait spin(spin_.get());
  for (const auto& request : requests) {
    while (!request->done) {
      throw_if_failed();
      if (Clock::now() >= deadline) timeout(requests);
      if (spin.spinning()) {
        progress(0);
        if (!request->done) spin.pause();
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
  fail_and_throw(Error(Error::Kind::kTimeout, "MCCL timeout: rank " + std::to_string(rank_) + " timed out in " +
                                                  context() + " waiting for " + what +
                                                  ". That peer is stopped, hung, or not calling the same collective."));
}

// The poll set: every lane of every open peer that has something to write, and lane 0 (always: frames
// may come at any time) plus the lanes with a share due, for reading.
void Transport::progress(int timeout_ms) {
  throw_if_failed();
  std::vector<pollfd>& fds = poll_fds_;  // reused: no allocation per round
  fds.clear();
  poll_owners_.clear();
  fds.push_back({wake_read_, POLLIN, 0});
  for (auto& p : peers_) {
    if (!p || p->closed()) continue;
    for (int lane = 0; lane < p->lanes(); ++lane) {
      const short events = (p->wants_read(lane) ? POLLIN : 0) | (p->wants_write(lane) ? POLLOUT : 0);
      if (events == 0) continue;
      fds.push_back({p->fd(lane), events, 0});
      poll_owners_.emplace_back(p.get(), lane);
    }
  }
  int ready = ::poll(fds.data(), fds.size(), liveness_.clamp(timeout_ms, round_start_));
  round_start_ = Clock::now();
  if (ready < 0) {
    if (errno != EINTR) mccl::fail(Error::Kind::kInternal, "poll failed: ", std::strerror(errno));
    ready = 0;
  }
  if (sender_news()) retire_sent();
  for (size_t i = 1; ready > 0 && i < fds.size(); ++i) {
    Peer& peer = *poll_owners_[i - 1].first;
    const int lane = poll_owners_[i - 1].second;
    try {
      if (fds[i].revents & POLLOUT) peer.write(lane, round_start_);
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && peer.wants_read(lane)) peer.read(lane, round_start_);
    } catch (const Error& e) {
      fail_peer(peer, e);
    }
  }
  if (ready > 0 && (fds[0].revents & POLLIN)) {
    drain_wake_pipe(wake_read_);
    if (on_wakeup_) on_wakeup_();
  }
  check_liveness();
}

void Transport::check_liveness() {
  if (!liveness_.due(round_start_)) return;
  for (auto& p : peers_) {
    if (!p || p->closed()) continue;
    if (liveness_.silent(p->last_heard(), round_start_)) {
      fail_peer(*p, Error(Error::Kind::kTimeout,
                          liveness_.silence(rank_, p->name(), p->last_heard(), round_start_,
                                            busy_ ? "during " + context() : std::string("between collectives"))));
    }
    if (!liveness_.owes_heartbeat(p->last_sent(), round_start_)) continue;
    try {
      p->heartbeat(round_start_);
    } catch (const Error& e) {
      fail_peer(*p, e);
    }
  }
}

void Transport::set_send_thread(size_t min_bytes) {
  threads_.min_bytes = min_bytes;
  if (min_bytes == 0 || size_ == 1 || !threads_.by_lane.empty()) return;
  for (int lane = 0; lane < nsocks_; ++lane)
    threads_.by_lane.push_back(std::make_unique<Sender>(size_, [this] { wake(); }, spin_adaptive_, spin_fixed_));
}

bool Transport::sender_news() const {
  for (const auto& sender : threads_.by_lane) {
    if (sender->has_news()) return true;
  }
  return false;
}

// The senders finished segments (retired here, on the progress thread) or hit a socket error.
void Transport::retire_sent() {
  for (int lane = 0; lane < static_cast<int>(threads_.by_lane.size()); ++lane) {
    if (!threads_.by_lane[lane]->has_news()) continue;
    sent_reports_.clear();
    threads_.by_lane[lane]->collect(&sent_reports_);
    for (int rank = 0; rank < static_cast<int>(sent_reports_.size()); ++rank) {
      const Sender::Report& report = sent_reports_[rank];
      if (report.finished == 0 && report.error.empty()) continue;
      Peer& peer = *peers_[rank];
      if (report.finished > 0) peer.retire(lane, report.finished, round_start_);
      if (!report.error.empty()) fail_peer(peer, Error(Error::Kind::kConnection, report.error));
    }
  }
}

// Before the transport writes to a socket itself again (an abort frame) or frees what a sender may
// still be reading: the senders stop, the segments they finished retire, and each lane takes back the
// first unfinished one with how much of it went out, so send_abort() can finish it.
void Transport::stop_sender() {
  std::vector<size_t> head_progress;
  for (int lane = 0; lane < static_cast<int>(threads_.by_lane.size()); ++lane) {
    threads_.by_lane[lane]->stop(&head_progress);
    sent_reports_.clear();
    threads_.by_lane[lane]->collect(&sent_reports_);
    for (int rank = 0; rank < size_; ++rank) {
      if (!peers_[rank]) continue;
      peers_[rank]->retire(lane, sent_reports_[rank].finished, round_start_);
      peers_[rank]->take_back(lane, head_progress[rank]);
    }
  }
  threads_.by_lane.clear();
}

// Best effort, bounded: tells each peer why this rank is giving up, on a frame boundary (a segment that
// is half sent is finished first).
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
  auto abort = std::make_shared<Request>();
  FrameHeader& h = abort->header;
  h.channel = static_cast<uint8_t>(Channel::kControl);
  h.kind = static_cast<uint8_t>(ControlKind::kAbort);
  h.comm_id = comm_id_;
  h.src_rank = static_cast<uint32_t>(rank_);
  h.count = kind;
  h.length = text.size();
  abort->data = text.data();
  abort->length = text.size();
  const Deadline deadline = Clock::now() + std::chrono::milliseconds(200);
  for (auto& p : peers_) {
    if (!p || p->closed()) continue;
    try {
      p->write_abort(whole_frame(abort), deadline);
    } catch (const Error&) {
      // The peer is gone or stuck; the closed socket tells it enough.
    }
  }
}

// Closing a socket with unread bytes makes the kernel send a reset, and a reset makes the peer's kernel
// drop what it had received but not yet read: our abort frame. So the sockets are read empty first;
// after a failure, also for a moment longer (bounded), until the peers close their ends too.
void Transport::drain_before_close() {
  const Deadline deadline = Clock::now() + std::chrono::milliseconds(fatal_ ? 100 : 0);
  std::vector<pollfd> fds;
  for (auto& p : peers_) {
    for (int lane = 0; p && lane < p->lanes(); ++lane) fds.push_back({p->fd(lane), POLLIN, 0});
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

void Transport::fail_peer(const Peer& peer, const Error& cause) {
  if (cause.kind() != Error::Kind::kConnection) fail_and_throw(cause);
  fail_and_throw(Error(Error::Kind::kConnection,
                       "MCCL connection error: rank " + std::to_string(rank_) + " lost its connection to " +
                           peer.name() + " during " + context() + " (" + cause.what() +
                           "). That process probably exited or crashed: look at its log for the first error."));
}

void Transport::fail_and_throw(const Error& error) {
  if (fatal_) std::rethrow_exception(fatal_);
  fail(std::make_exception_ptr(error));
  throw error;
}

void Transport::fail(std::exception_ptr error, bool notify_peers) {
  if (fatal_) return;
  fatal_ = error;
  stop_sender();
  if (notify_peers) send_abort(error);
  for (auto& p : peers_) {
    if (p) p->shutdown_write();  // the peers read our abort, then end of stream
  }
  std::vector<RequestPtr> pending;
  matcher_.drop_all(&pending);
  for (auto& p : peers_) {
    if (p) p->drop_all(&pending);
  }
  for (auto& request : pending) complete(request, error);
}

}  // namespace mccl
