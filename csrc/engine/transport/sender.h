// The sender: a thread that writes large segments (MCCL_SEND_THREAD_BYTES), so that the progress thread
// receives and reduces while they go out. Without it one thread pays for every kernel copy in turn:
// on a ring step it sends a piece, then receives the next, then reduces it. With it the send of piece
// k overlaps the receive and reduction of piece k+1, as Gloo's device thread overlaps its caller.
//
// Ownership: the progress thread keeps every segment (frame_cursor.h) in its lane's send queue and decides
// which ones the sender writes (a large one, and every one queued behind it, so the order on the wire
// stays the posting order). There is one sender per lane index, with a slot per peer. It writes each
// slot's segments in order, through the same cursor (gather / advance) as the progress thread, one socket
// at a time or several when some would block, waiting in poll() on those sockets and its wake pipe. It
// never completes a request: it counts finished segments per slot and calls `notify` (Transport::wake);
// the progress thread collects the counts and retires them itself (Peer::retire), so completion
// callbacks stay on one thread. A socket error stops that slot and is reported the same way.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "spin.h"
#include "transport/frame_cursor.h"

namespace mccl {

class Sender {
 public:
  // One slot per peer rank; notify() runs on the sender thread after frames finish or a write fails.
  // With nothing to write the thread polls for new frames before it sleeps, as MCCL_SPIN_US says (spin.h:
  // adaptive, else `spin`): the next piece of a ring step usually comes sooner than a sleeping thread could
  // be woken for it.
  Sender(int slots, std::function<void()> notify, bool adaptive_spin, std::chrono::microseconds spin);
  ~Sender();  // stop()s
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // Hands over `segment` for socket `fd`, written after the segments handed over before it in this
  // slot; its first segment.progress bytes are already on the wire.
  void submit(int slot, int fd, FrameCursor segment);

  // Whether collect() has something: an atomic load, cheap enough for every progress round.
  bool has_news() const { return news_.load(std::memory_order_acquire); }

  struct Report {
    size_t finished = 0;  // segments of this slot fully written since the last collect()
    std::string error;    // the socket error that stopped this slot, if any
  };
  // Reports per slot (out is resized to the slot count; counts are added to).
  void collect(std::vector<Report>* out);

  // Stops writing and joins the thread. head_progress (if given) gets, per slot, the bytes written of
  // the first segment it had not finished (0 if none). Idempotent; nothing is written afterwards.
  void stop(std::vector<size_t>* head_progress = nullptr);

 private:
  struct Slot {
    int fd = -1;
    std::deque<FrameCursor> jobs;
    size_t finished = 0;
    std::string error;
  };
  void run();
  size_t write_some(Slot& slot, int fd, std::vector<FrameCursor>& batch, std::string* error, bool* finished_any);

  std::function<void()> notify_;
  std::mutex mu_;  // guards slots_ (jobs, finished, error), polling_, stop_
  std::vector<Slot> slots_;
  bool polling_ = false;  // the thread is (about to be) blocked in poll(): submit() must write the pipe
  bool stop_ = false;
  std::atomic<bool> news_{false};
  std::atomic<uint64_t> submitted_{0};  // segments handed over so far: what the idle spin watches
  SpinPolicy spin_;
  int wake_read_ = -1, wake_write_ = -1;
  std::thread thread_;
};

}  // namespace mccl
