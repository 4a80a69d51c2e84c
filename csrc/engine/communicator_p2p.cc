// Point-to-point send and recv of a communicator: checked on the caller's thread, posted to the transport
// by the progress thread (as a command), matched by tag; each keeps its own deadline, since no collective
// carries one for it.
#include "communicator.h"

#include <algorithm>

#include "error.h"
#include "socket.h"

namespace mccl {

WorkPtr Communicator::send(const void* buf, size_t count, DataType dtype, int peer, uint64_t tag, Callback done) {
  return post_p2p(true, const_cast<void*>(buf), count, dtype, peer, tag, std::move(done));
}

WorkPtr Communicator::recv(void* buf, size_t count, DataType dtype, int peer, uint64_t tag, Callback done) {
  return post_p2p(false, buf, count, dtype, peer, tag, std::move(done));
}

WorkPtr Communicator::post_p2p(bool is_send, void* buf, size_t count, DataType dtype, int peer, uint64_t tag,
                               Callback done) {
  check_usable();
  const char* what = is_send ? "send" : "recv";
  MCCL_CHECK_ARG(peer != rank_, "rank ", rank_, ": ", what, " to/from itself is not supported");
  if (!(peer == kAnySource && !is_send)) check_rank(peer, "peer", what);
  FrameHeader h;
  h.channel = static_cast<uint8_t>(Channel::kPointToPoint);
  h.kind = static_cast<uint8_t>(CollectiveKind::kSend);
  h.seq = tag;
  h.dtype = static_cast<uint8_t>(dtype);
  h.count = count;
  const size_t bytes = count * dtype_size(dtype);
  auto work = std::make_shared<Work>(std::move(done));
  CommStats::Counters& counters = stats_.of(h.kind);
  work->count_waits_in(&counters.wait_ns);
  work->spin_with(caller_spin_);
  auto command = [this, is_send, buf, bytes, peer, h, work, &counters] {
    CommStats::add(counters.calls, 1);
    auto on_done = [work, &counters, posted = Clock::now()](const Request& r, std::exception_ptr error) {
      CommStats::add(counters.busy_ns, CommStats::ns_between(posted, Clock::now()));
      work->finish(error, r.source);
    };
    try {
      RequestPtr request = is_send ? transport_->post_send(peer, h, buf, bytes, on_done)
                                   : transport_->post_recv(peer, h, buf, bytes, on_done);
      if (!request->done) p2p_pending_.push_back({Clock::now() + timeout(), request});
    } catch (...) {
      if (!work->completed()) work->finish(std::current_exception());
    }
  };
  {
    // Checked again under the lock that stop() sets stopping_ under: once the progress thread may have
    // stopped, nothing is queued that it would never run.
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_unusable();
    commands_.push_back(std::move(command));
  }
  transport_->wake();
  cv_.notify_all();
  return work;
}

// Point-to-point operations have no collective around them to carry a deadline, so the progress
// thread keeps theirs: poll() wakes up for the nearest one, and an expired one is a fatal timeout.
int Communicator::p2p_poll_timeout_ms() {
  p2p_pending_.remove_if([](const PendingP2P& p) { return p.request->done; });
  if (p2p_pending_.empty()) return -1;
  Deadline nearest = p2p_pending_.front().deadline;
  for (const auto& p : p2p_pending_) nearest = std::min(nearest, p.deadline);
  return std::max(1, ms_until(nearest, 60 * 1000));
}

void Communicator::check_p2p_deadlines() {
  const auto now = Clock::now();
  for (const auto& p : p2p_pending_) {
    if (p.request->done || p.deadline > now) continue;
    const Request& r = *p.request;
    std::string peer = r.peer == kAnySource ? std::string("any rank") : transport_->peer_name(r.peer);
    fail(Error::Kind::kTimeout, "rank ", rank_, " timed out after ", timeout().count(), " ms in ",
         r.type == Request::Type::kSend ? "send to " : "recv from ", peer, " (tag ", r.header.seq,
         "): the peer never posted the matching ", r.type == Request::Type::kSend ? "recv" : "send");
  }
}

}  // namespace mccl
