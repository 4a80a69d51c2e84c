// A communicator: this rank's connections to the other ranks of one group, and the progress thread
// that runs its operations.
//
// Collectives are queued and run one at a time on the progress thread, in the order of issue_order.h:
// issue order on each thread, with the collectives issued from a completion callback run before the
// ones that callback's collective holds back, so that every rank runs them in the same order whatever
// the timing of callbacks. Each gets the next sequence number when it starts, which is what matches
// them up across ranks. Point-to-point sends and receives are posted to the transport as soon as the
// progress thread sees them, so they can complete in any order relative to collectives, like Gloo's.
// Every call returns a Work handle. Arguments are checked on the caller's thread, so bad input
// raises at the call. The first failure is fatal: it is delivered to every pending operation and
// rethrown by every later call (Gloo's rule), and the sockets are shut so the peers fail fast too.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collective.h"
#include "config.h"
#include "dtype.h"
#include "issue_order.h"
#include "spin.h"
#include "stats.h"
#include "store.h"
#include "timeline.h"
#include "transport/transport.h"
#include "work.h"

namespace mccl {

class Communicator {
 public:
  // Rendezvous through `store` and connect to every peer; `route_to` (MASTER_ADDR) picks the interface
  // when MCCL_SOCKET_IFNAME is unset. Throws on failure, naming the rank that did not show up.
  Communicator(Store& store, int rank, int size, std::chrono::milliseconds timeout, const std::string& route_to,
               const Config& config = Config::global());
  ~Communicator();  // shutdown()
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed));
  }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ms_.store(timeout.count(), std::memory_order_relaxed); }
  const std::string& listen_address() const { return listen_address_; }
  // The settings this communicator was made with (fixed for its lifetime).
  const Config& config() const { return config_; }

  // Buffers must stay valid until the Work completes. Counts are elements of dtype. `done` runs when the
  // collective ends (work.h); `start_after` (may be empty) runs on the progress thread right before it starts:
  // the torch layer waits there for device copies into its buffers, so the caller's thread does not. An
  // exception from it fails the collective, like a transport error.
  using StartAfter = std::function<void()>;
  WorkPtr allreduce(void* buf, size_t count, DataType dtype, ReduceOp op, Callback done = nullptr,
                    StartAfter start_after = nullptr);
  WorkPtr broadcast(void* buf, size_t count, DataType dtype, int root, Callback done = nullptr,
                    StartAfter start_after = nullptr);
  WorkPtr reduce(void* buf, size_t count, DataType dtype, ReduceOp op, int root, Callback done = nullptr,
                 StartAfter start_after = nullptr);
  WorkPtr allgather(const void* in, size_t count, DataType dtype, std::vector<char*> outs, Callback done = nullptr,
                    StartAfter start_after = nullptr);
  WorkPtr reduce_scatter(const void* in, size_t count, DataType dtype, ReduceOp op, void* out,
                         Callback done = nullptr, StartAfter start_after = nullptr);
  WorkPtr gather(const void* in, size_t count, DataType dtype, std::vector<char*> outs, int root,
                 Callback done = nullptr, StartAfter start_after = nullptr);
  WorkPtr scatter(std::vector<const char*> ins, void* out, size_t count, DataType dtype, int root,
                  Callback done = nullptr, StartAfter start_after = nullptr);
  WorkPtr alltoall(const void* in, std::vector<size_t> send_counts, void* out, std::vector<size_t> recv_counts,
                   DataType dtype, Callback done = nullptr, StartAfter start_after = nullptr);
  WorkPtr barrier(Callback done = nullptr, StartAfter start_after = nullptr);
  // The 8-bit allreduce (docs/int8.md, algorithms/int8_allreduce.cc): float32 values, SUM or AVG, that travel as
  // 8-bit blocks (int8_blocks.h), whatever MCCL_WIRE_DTYPE says, each encoded once by its rank and once, summed,
  // by its owner (MCCL_INT8_ALGO=ring: the partial sums also once at every hop on the way). `residual` (null, or
  // `count` floats of this rank's, zeros at first and kept by the caller between calls, in memory the progress
  // thread may write): error feedback. It is added to the values before they are encoded, and then holds what
  // this rank's encodings lost: of every value, and of the sums of the values it owns (in the units of the sum),
  // which the next call adds back (not the ring's hops). One rank: nothing changes.
  WorkPtr allreduce_int8(float* buf, size_t count, ReduceOp op, float* residual, Callback done = nullptr,
                         StartAfter start_after = nullptr);
  // The same collective on values this rank has encoded already (on its device: csrc/torch/int8_codec.cpp):
  // `blocks` holds int8_wire_bytes(count) bytes, the encoded values plus their residual, and ends holding the
  // encoded result. `owned_error` (null, or int8_segment(count, rank, size).count floats): the residual of the
  // values this rank owns, to which the error of their sums' encoding is added. Same frames as allreduce_int8's,
  // so ranks may mix the two.
  WorkPtr allreduce_int8_blocks(char* blocks, size_t count, ReduceOp op, float* owned_error, Callback done = nullptr,
                                StartAfter start_after = nullptr);
  // Point-to-point work is posted as soon as the progress thread sees it: its buffers must be ready.
  WorkPtr send(const void* buf, size_t count, DataType dtype, int peer, uint64_t tag, Callback done = nullptr);
  // peer may be kAnySource; Work::source() then tells who sent it.
  WorkPtr recv(void* buf, size_t count, DataType dtype, int peer, uint64_t tag, Callback done = nullptr);

  // Fails everything pending with kAborted, shuts the sockets, stops the thread. Idempotent.
  void abort();
  // Lets queued work finish (up to the timeout), then stops the thread and closes the sockets.
  void shutdown();
  uint64_t collectives_issued() const;
  // The traffic counters (stats.h): cheap to read from any thread.
  CommStats::Snapshot stats() const { return stats_.snapshot(); }
  // The latest collectives' times (timeline.h), oldest first: a copy, from any thread.
  std::vector<TimelineEntry> timeline() const { return timeline_.snapshot(); }

 private:

  // How a collective's payloads travel (codec.h).
  struct Wire {
    WireType type = WireType::kExact;
  };
  // What MCCL_WIRE_DTYPE gives a collective: float32 reductions travel in it, everything else exact.
  Wire wire_of_setting(CollectiveKind kind, DataType dtype) const;
  WorkPtr enqueue(CollectiveKind kind, DataType dtype, ReduceOp op, int root, uint64_t count, Wire wire,
                  std::function<void(Collective&)> body, Callback done, StartAfter start_after);
  WorkPtr post_p2p(bool is_send, void* buf, size_t count, DataType dtype, int peer, uint64_t tag, Callback done);
  void check_usable() const;
  void throw_if_unusable() const;  // check_usable() with mu_ held
  void check_reduction(DataType dtype, ReduceOp op, const char* what) const;
  void check_int8(ReduceOp op) const;
  void check_rank(int rank, const char* role, const char* what) const;
  int ranks_on_this_host() const;
  void run();
  void run_op(PendingCollective& op);
  int poll_timeout_ms(const IssueOrder::Next& next);
  void check_gate_deadline(const IssueOrder::Next& next);
  void stop(bool abort);
  void drain_commands();
  void drain_commands_after_failure();
  int p2p_poll_timeout_ms();
  void check_p2p_deadlines();

  const Config config_;
  int rank_;
  int size_;
  std::atomic<int64_t> timeout_ms_;  // timeout(): set_timeout() may change it while the progress thread reads it
  std::string listen_address_;
  CommStats stats_;  // before transport_, which counts into it
  Timeline timeline_;  // MCCL_TIMELINE_ENTRIES of config_
  SpinPolicy idle_spin_;                     // MCCL_SPIN_US: the progress thread between collectives
  std::shared_ptr<SpinPolicy> caller_spin_;  // MCCL_SPIN_US: callers in Work::wait (shared with their Work)
  std::unique_ptr<Transport> transport_;
  size_t reduce_threads_ = 1;  // MCCL_REDUCE_THREADS as resolved for this host
  std::vector<char> scratch_[2];
  WireBuffers wire_buffers_;

  std::mutex stop_mu_;  // serialises abort() / shutdown() joining the thread
  mutable std::mutex mu_;
  // The progress thread sleeps on cv_ only after a fatal error, until stop(), a p2p command or a collective
  // comes. enqueue() needs no notify: it adds under mu_ only while error_ is unset, and the thread checks
  // the queue under mu_ before it sleeps.
  std::condition_variable cv_;
  std::shared_ptr<IssueOrder> order_;                // collectives not yet started, and their order
  std::deque<std::function<void()>> commands_;       // p2p posts, run from the progress loop
  bool stopping_ = false;
  bool spinning_ = false;                            // the progress thread polls without sleeping: no wake needed
  bool abort_requested_ = false;
  std::exception_ptr error_;                         // mirror of the transport's fatal error, for callers
  uint64_t issued_ = 0;                              // collectives issued
  uint64_t next_seq_ = 0;                            // progress thread only: started
  struct PendingP2P {
    Deadline deadline;
    RequestPtr request;
  };
  std::list<PendingP2P> p2p_pending_;                // progress thread only
  std::thread thread_;
};

}  // namespace mccl
