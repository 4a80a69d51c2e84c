// The transport: MCCL_NSOCKS connected sockets ("pairs", one per lane) per peer, driven by poll() from a
// single thread, plus one sender thread per lane for large frames (sender.h).
//
// Algorithms post sends and receives and wait for them; this class moves the bytes and matches each
// incoming frame to the receive posted for it, keyed by (source, channel, seq) in posting order (FIFO
// per peer and lane, like MPI). A collective's frame travels on lane lane_of(header), a function of its
// step and offset that both ends compute, so the pieces of a ring step alternate between the lanes and
// each lane stays FIFO; point-to-point and control frames use lane 0. A frame that arrives before its
// receive is posted is kept as "unexpected" and
// copied out when the receive is posted. The expected header of each receive is compared with the
// received one before any payload is read, so a mismatched collective becomes an error naming both.
//
// Liveness: with heartbeats on, progress() never sleeps longer than half a heartbeat period, sends a
// heartbeat (a payload-less control frame, only between frames) to each peer it has sent nothing to
// for that period, and fails with a message naming the peer when nothing at all arrived from one for
// the heartbeat timeout. Control frames never reach the matching of data frames.
//
// Threading: every method except wake() runs on the communicator's progress thread. The first error
// (peer closed, timeout, protocol) is fatal: it is kept, every pending request fails with it, all
// sockets are shut down so the peers notice at once, and every later call rethrows it.
#pragma once

#include <poll.h>

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "error.h"
#include "sender.h"
#include "socket.h"
#include "stats.h"
#include "wire.h"

namespace mccl {

constexpr int kAnySource = -1;

struct Request {
  enum class Type { kSend, kRecv } type = Type::kSend;
  int peer = 0;            // kAnySource for a receive from whoever sends first
  FrameHeader header;      // what to send, or what the receive expects
  char* data = nullptr;
  size_t length = 0;
  size_t progress = 0;     // send: bytes of header+payload written
  bool done = false;
  int source = -1;         // receive: the rank it matched
  int lane = 0;            // the connection it travels on (Transport::lane_of)
  // Called once on the progress thread when the request completes (nullptr) or fails.
  std::function<void(const Request&, std::exception_ptr)> on_done;
};
using RequestPtr = std::shared_ptr<Request>;

class Transport {
 public:
  // peers: nsocks sockets per rank, indexed rank * nsocks + lane (Mesh::peers). stripe_bytes: the unit of
  // lane_of() (MCCL_CHUNK_BYTES, the ring's piece size).
  Transport(int rank, int size, uint64_t comm_id, std::vector<Socket> peers, std::vector<std::string> addresses,
            uint64_t max_message_bytes, int nsocks = 1, size_t stripe_bytes = 1);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  uint64_t comm_id() const { return comm_id_; }
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
  // The interval used is at most a quarter of the timeout.
  void set_heartbeat(std::chrono::milliseconds interval, std::chrono::milliseconds timeout);
  // MCCL_SPIN_US: how long wait() polls without sleeping before it blocks in poll().
  void set_spin(std::chrono::microseconds spin) { spin_ = spin; }
  // MCCL_SEND_THREAD_BYTES: frames with at least this many payload bytes (and any frame queued behind
  // one) are written by a sender thread (sender.h) while this thread receives and reduces; 0: none.
  void set_send_thread(size_t min_bytes);
  // Counts the payload bytes of every frame posted (after compression) into `stats`, which must outlive this.
  void set_stats(CommStats* stats) { stats_ = stats; }

  // What is running now, for error messages ("allreduce #12 of 1024 float32 (sum)"); described only
  // when a message needs it, so the data path builds no strings. set_idle(): nothing is running.
  void set_context(const FrameHeader& op) { context_ = op, busy_ = true; }
  void set_idle() { busy_ = false; }
  // With several lanes, right after set_context(): frames of this collective that arrived before it
  // started are checked against it (check_identity). Throws kMismatch.
  void check_arrived_frames();

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
  struct Pair;
  // Heap memory for frames that arrive before their receive is posted; recycled, never zero-filled.
  struct Buffer {
    std::unique_ptr<char[]> bytes;
    size_t capacity = 0;
    char* data() const { return bytes.get(); }
  };
  struct Unexpected {
    int source = -1;
    int lane = 0;
    FrameHeader header;
    Buffer buffer;
  };
  Buffer take_buffer(size_t size);
  void recycle(Buffer buffer);
  void grow_stash(Pair& pair);

  Pair& pair_for(int rank, int lane) { return *pairs_[static_cast<size_t>(rank) * nsocks_ + lane]; }
  int lane_of(const FrameHeader& h) const;
  void read_ready(Pair& pair);
  void write_ready(Pair& pair);
  void on_header(Pair& pair);
  void deliver(Pair& pair);
  void on_peer_closed(Pair& pair, const Error& cause);
  void on_control(Pair& pair);
  Error closed_error(const Pair& pair) const;
  void send_abort(const std::exception_ptr& error);
  void drain_before_close();
  void finish_unexpected(Pair& pair);
  void complete(const RequestPtr& request);
  bool matches(const Request& r, int source, int lane, const FrameHeader& h) const;
  void validate_match(const Request& r, const FrameHeader& h, int source);
  void check_identity(const FrameHeader& h, int source);
  [[noreturn]] void fail_pair(const Pair& pair, const Error& cause);
  [[noreturn]] void timeout(const std::vector<RequestPtr>& pending);
  void check_liveness();
  int clamp_to_heartbeat(int timeout_ms) const;
  void hand_over(Pair& pair);
  bool sender_news() const;
  void retire_sent();
  void stop_sender();

  int rank_;
  int size_;
  uint64_t comm_id_;
  uint64_t max_message_bytes_;
  std::vector<std::string> addresses_;
  int nsocks_;
  size_t stripe_bytes_;
  std::vector<std::unique_ptr<Pair>> pairs_;  // indexed by rank * nsocks_ + lane; nullptr for self
  std::list<RequestPtr> posted_recvs_;        // in posting order
  std::list<Unexpected> unexpected_;          // complete frames nobody asked for yet, in arrival order
  std::vector<Buffer> spare_buffers_;         // recycled Unexpected buffers
  size_t spare_bytes_ = 0;                    // their capacity, at most 8 MiB
  std::vector<struct pollfd> poll_fds_;       // progress()'s poll set, rebuilt each round
  std::vector<Pair*> poll_owners_;
  int wake_read_ = -1;
  int wake_write_ = -1;
  std::function<void()> on_wakeup_;
  // Heartbeats: the clock is read once per progress round, after poll() (round_start_).
  bool heartbeats_ = false;
  Clock::duration heartbeat_interval_{};
  Clock::duration heartbeat_timeout_{};
  Clock::time_point round_start_;
  Clock::time_point next_liveness_check_;
  std::chrono::microseconds spin_{0};
  std::vector<std::unique_ptr<Sender>> senders_;  // one per lane; empty unless set_send_thread() turned them on
  size_t send_thread_bytes_ = 0;
  std::vector<Sender::Report> sent_reports_;  // reused by retire_sent()
  std::string context() const { return busy_ ? describe(context_) : "idle"; }
  FrameHeader context_;
  bool busy_ = false;
  std::exception_ptr fatal_;
  CommStats* stats_ = nullptr;
};

}  // namespace mccl
