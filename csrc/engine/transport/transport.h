// The transport: this rank's connections to every other rank, driven by poll() from one thread (the
// communicator's progress thread). Algorithms post sends and receives and wait for them; the transport
// owns the poll loop, the wake-up pipe and failure, and delegates everything else to its layers:
//
//   peer.h          a peer's MCCL_NSOCKS sockets ("lanes"), send queues, read state, and the payload split
//                   across lanes below the frame
//   frame_cursor.h  the one write path: fill and advance the iovecs of a frame's segments
//   sender.h        the sender threads (one per lane index) that write large frames
//   matcher.h       posted and unexpected receives keyed by (source, channel, seq), validation, strays
//   liveness.h      heartbeats and silent peers
//
// Threading: every method except wake() runs on the progress thread. The first error (peer closed,
// timeout, protocol, mismatch) is fatal: it is kept, every pending request fails with it, each peer is
// told the cause (an abort frame), all sockets are shut down so the peers notice at once, and every later
// call rethrows it. See docs/transport.md.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "error.h"
#include "socket.h"
#include "spin.h"
#include "stats.h"
#include "transport/liveness.h"
#include "transport/matcher.h"
#include "transport/peer.h"
#include "transport/request.h"
#include "transport/sender.h"
#include "wire.h"

namespace mccl {

class Transport {
 public:
  // peers: nsocks sockets per rank, indexed rank * nsocks + lane (Mesh::peers).
  Transport(int rank, int size, uint64_t comm_id, std::vector<Socket> peers, std::vector<std::string> addresses,
            uint64_t max_message_bytes, int nsocks = 1);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& address_of(int rank) const { return addresses_[rank]; }
  std::string peer_name(int rank) const;  // "rank 3 (10.0.0.4:5123)"

  RequestPtr post_send(int peer, const FrameHeader& header, const void* data, size_t length,
                       std::function<void(const Request&, std::exception_ptr)> on_done = nullptr);
  RequestPtr post_recv(int peer, const FrameHeader& expected, void* data, size_t length,
                       std::function<void(const Request&, std::exception_ptr)> on_done = nullptr);

  // Progresses until the request(s) complete. Throws the fatal error, or kTimeout at the deadline.
  void wait(const RequestPtr& request, Deadline deadline);
  void wait_all(const std::vector<RequestPtr>& requests, Deadline deadline);

  // One round of I/O: blocks in poll() up to timeout_ms (-1: until something happens or wake()).
  void progress(int timeout_ms);

  // Thread-safe: interrupts a progress() blocked in poll(); then on_wakeup runs on the progress thread.
  void wake();
  void set_on_wakeup(std::function<void()> fn) { on_wakeup_ = std::move(fn); }

  // Heartbeats (MCCL_HEARTBEAT_INTERVAL / MCCL_HEARTBEAT_TIMEOUT); a zero timeout turns them off.
  void set_heartbeat(std::chrono::milliseconds interval, std::chrono::milliseconds timeout) {
    liveness_.configure(interval, timeout, round_start_);
  }
  // MCCL_SPIN_US (spin.h): how long wait() polls without sleeping before it blocks in poll(), and each
  // sender thread waits for frames before it sleeps; adaptive (auto), else `fixed`. Before set_send_thread().
  void set_spin(bool adaptive, std::chrono::microseconds fixed);
  // MCCL_SEND_THREAD_BYTES: frames with at least this many payload bytes (and any frame queued behind
  // one) are written by a sender thread (sender.h) while this thread receives and reduces; 0: none.
  void set_send_thread(size_t min_bytes);
  // Counts the payload bytes of every frame posted (after compression) into `stats`, which must outlive this.
  void set_stats(CommStats* stats) { stats_ = stats; }

  // What is running now, for error messages ("allreduce #12 of 1024 float32 (sum)"); described only
  // when a message needs it, so the data path builds no strings. set_idle(): nothing is running.
  void set_context(const FrameHeader& op) { context_ = op, busy_ = true; }
  void set_idle() { busy_ = false; }

  // Makes `error` the fatal error (the first one wins), fails everything pending, shuts the sockets.
  // With notify_peers, first tells each peer the cause (an abort frame); a clean shutdown does not.
  void fail(std::exception_ptr error, bool notify_peers = true);
  std::exception_ptr fatal_error() const { return fatal_; }
  void throw_if_failed() const;

  // After collective #seq has completed here: every frame of it (or of an earlier one) that this rank
  // was sent has been received, so one still unmatched means the ranks called different collectives
  // (e.g. a broadcast whose root differs per rank, where both "roots" only send). Throws kMismatch.
  void check_no_stray_frames(uint64_t seq);

 private:
  // fail(error), then throw it (or the fatal error that came first).
  [[noreturn]] void fail_and_throw(const Error& error);
  // The same for an error on the connection to `peer`, explained ("that process probably exited").
  [[noreturn]] void fail_peer(const Peer& peer, const Error& cause);
  [[noreturn]] void timeout(const std::vector<RequestPtr>& pending);
  void check_liveness();
  void send_abort(const std::exception_ptr& error);
  void drain_before_close();
  bool sender_news() const;
  void retire_sent();
  void stop_sender();
  std::string context() const { return busy_ ? describe(context_) : "idle"; }

  int rank_;
  int size_;
  uint64_t comm_id_;
  int nsocks_;
  std::vector<std::string> addresses_;
  Matcher matcher_;
  SendThreads threads_;                     // before peers_, which point at it
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; nullptr for this rank
  std::vector<struct pollfd> poll_fds_;     // progress()'s poll set, rebuilt each round
  std::vector<std::pair<Peer*, int>> poll_owners_;  // (peer, lane) of each entry after the wake pipe
  int wake_read_ = -1;
  int wake_write_ = -1;
  std::function<void()> on_wakeup_;
  Clock::time_point round_start_;  // the clock, read once per progress round, after poll()
  Liveness liveness_;
  bool spin_adaptive_ = false;
  std::chrono::microseconds spin_fixed_{0};
  std::unique_ptr<SpinPolicy> spin_;  // wait()'s
  std::vector<Sender::Report> sent_reports_;  // reused by retire_sent()
  FrameHeader context_;
  bool busy_ = false;
  std::exception_ptr fatal_;
  CommStats* stats_ = nullptr;
};

}  // namespace mccl
