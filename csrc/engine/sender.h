// The sender: a thread that writes large frames (MCCL_SEND_THREAD_BYTES), so that the progress thread
// receives and reduces while they go out. Without it one thread pays for every kernel copy in turn:
// on a ring step it sends a piece, then receives the next, then reduces it. With it the send of piece
// k overlaps the receive and reduction of piece k+1, as Gloo's device thread overlaps its caller.
//
// Ownership: the progress thread keeps every frame in its pair's send queue and decides which ones the
// sender writes (a large frame, and every frame queued behind one, so the order on the wire stays the
// posting order). The sender writes them in order per peer, one socket at a time or several when some
// would block, waiting in poll() on those sockets and its wake pipe. It never completes a request: it
// counts finished frames per peer and calls `notify` (Transport::wake); the progress thread collects
// the counts and completes the requests itself, so completion callbacks stay on one thread.
// A socket error stops that peer's frames and is reported the same way.
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

namespace mccl {

struct Request;

class Sender {
 public:
  // One slot per peer rank; notify() runs on the sender thread after frames finish or a write fails.
  // With nothing to write the thread polls for new frames for `spin` (MCCL_SPIN_US) before it sleeps:
  // the next piece of a ring step usually comes sooner than a sleeping thread could be woken for it.
  Sender(int slots, std::function<void()> notify, std::chrono::microseconds spin);
  ~Sender();  // stop()s
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // Hands over frame `request` for socket `fd`, written after the frames handed over before it in this
  // slot; its first request->progress bytes (header, then payload) are already on the wire.
  void submit(int slot, int fd, std::shared_ptr<Request> request);

  // Whether collect() has something: an atomic load, cheap enough for every progress round.
  bool has_news() const { return news_.load(std::memory_order_acquire); }

  struct Report {
    size_t finished = 0;  // frames of this slot fully written since the last collect()
    std::string error;    // the socket error that stopped this slot, if any
  };
  // Reports per slot (out is resized to the slot count; counts are added to).
  void collect(std::vector<Report>* out);

  // Stops writing and joins the thread. head_progress (if given) gets, per slot, the bytes written of
  // the first frame it had not finished (0 if none). Idempotent; nothing is written afterwards.
  void stop(std::vector<size_t>* head_progress = nullptr);

 private:
  struct Job {
    std::shared_ptr<Request> request;
    size_t progress = 0;  // header+payload bytes written
  };
  struct Slot {
    int fd = -1;
    std::deque<Job> jobs;
    size_t finished = 0;
    std::string error;
  };
  void run();
  size_t write_some(Slot& slot, int fd, const std::vector<Job>& batch, std::string* error, bool* finished_any);

  std::function<void()> notify_;
  std::mutex mu_;  // guards slots_ (jobs, finished, error), polling_, stop_
  std::vector<Slot> slots_;
  bool polling_ = false;  // the thread is (about to be) blocked in poll(): submit() must write the pipe
  bool stop_ = false;
  std::atomic<bool> news_{false};
  std::atomic<uint64_t> submitted_{0};  // frames handed over so far: what the idle spin watches
  std::chrono::microseconds spin_;
  int wake_read_ = -1, wake_write_ = -1;
  std::thread thread_;
};

}  // namespace mccl
