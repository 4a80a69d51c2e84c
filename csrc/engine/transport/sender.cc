#include "transport/sender.h"

#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "error.h"
#include "socket.h"
#include "thread_name.h"

namespace mccl {
namespace {
constexpr size_t kBatch = kMaxIov / 2;  // segments per sendmsg (head and payload each take an iovec)
}  // namespace

Sender::Sender(int slots, std::function<void()> notify, bool adaptive_spin, std::chrono::microseconds spin)
    : notify_(std::move(notify)), slots_(slots), spin_(adaptive_spin, spin, SpinPolicy::Site::kHelper) {
  make_wake_pipe(&wake_read_, &wake_write_);
  thread_ = std::thread([this] {
    set_thread_name("mccl-sender");
    run();
  });
}

Sender::~Sender() {
  stop();
  ::close(wake_read_);
  ::close(wake_write_);
}

void Sender::submit(int slot, int fd, FrameCursor segment) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Slot& s = slots_[slot];
    s.fd = fd;
    s.jobs.push_back(std::move(segment));
    submitted_.fetch_add(1, std::memory_order_release);
    wake = polling_;
  }
  if (wake) write_wake_pipe(wake_write_);
}

void Sender::collect(std::vector<Report>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  news_.store(false, std::memory_order_relaxed);
  out->resize(slots_.size());
  for (size_t s = 0; s < slots_.size(); ++s) {
    (*out)[s].finished += slots_[s].finished;
    slots_[s].finished = 0;
    if (!slots_[s].error.empty()) (*out)[s].error = slots_[s].error;
  }
}

void Sender::stop(std::vector<size_t>* head_progress) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  write_wake_pipe(wake_write_);
  if (thread_.joinable()) thread_.join();
  if (head_progress) {
    head_progress->assign(slots_.size(), 0);
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (!slots_[s].jobs.empty()) (*head_progress)[s] = slots_[s].jobs.front().progress;
    }
  }
}

// One sendmsg() with the batch's remaining bytes; the batch is a copy of the slot's first segments, taken
// under mu_ (submit() may grow the queue meanwhile, but only this thread removes from it). Returns the
// bytes written; segments it finished are popped and counted in the slot (*finished_any).
size_t Sender::write_some(Slot& slot, int fd, std::vector<FrameCursor>& batch, std::string* error, bool* finished_any) {
  iovec iov[kMaxIov];
  const int count = gather(batch.begin(), batch.end(), iov);
  size_t written = 0;
  try {
    written = Socket::send_some_on(fd, iov, count);
  } catch (const Error& e) {
    *error = e.what();
    return 0;
  }
  std::lock_guard<std::mutex> lock(mu_);
  const size_t finished = advance(slot.jobs.begin(), written);
  slot.jobs.erase(slot.jobs.begin(), slot.jobs.begin() + static_cast<std::ptrdiff_t>(finished));
  slot.finished += finished;
  *finished_any = *finished_any || finished > 0;
  return written;
}

// Each round: every slot with frames gets one sendmsg(); when none of them moved a byte, wait in poll()
// for those sockets to drain (or for new frames, or stop()).
void Sender::run() {
  std::vector<int> active;
  std::vector<std::vector<FrameCursor>> batches(slots_.size());
  std::vector<int> batch_fds(slots_.size(), -1);
  std::vector<pollfd> fds;
  for (;;) {
    active.clear();
    uint64_t seen;  // frames submitted when this snapshot was taken
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      seen = submitted_.load(std::memory_order_relaxed);
      for (size_t s = 0; s < slots_.size(); ++s) {
        Slot& slot = slots_[s];
        if (slot.jobs.empty() || !slot.error.empty()) continue;
        active.push_back(static_cast<int>(s));
        batches[s].assign(slot.jobs.begin(), slot.jobs.begin() + std::min(kBatch, slot.jobs.size()));
        batch_fds[s] = slot.fd;
      }
      polling_ = false;
    }
    if (active.empty()) {
      // Idle: spin for the next frame a while, then sleep until submit() or stop() writes the pipe.
      SpinPolicy::Wait spin(&spin_);
      while (submitted_.load(std::memory_order_acquire) == seen && spin.spinning()) spin.pause();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_ || submitted_.load(std::memory_order_relaxed) != seen) continue;
        polling_ = true;  // from here on, submit() writes the pipe
      }
      pollfd pfd{wake_read_, POLLIN, 0};
      ::poll(&pfd, 1, -1);
      drain_wake_pipe(wake_read_);
      continue;
    }
    bool moved = false, news = false;
    for (int s : active) {
      std::string error;
      moved = write_some(slots_[s], batch_fds[s], batches[s], &error, &news) > 0 || moved;
      if (error.empty()) continue;
      std::lock_guard<std::mutex> lock(mu_);
      slots_[s].error = error;
      news = true;
    }
    if (news) {
      news_.store(true, std::memory_order_release);
      notify_();
    }
    if (moved) continue;
    // Every socket we hold frames for is full: sleep until one drains, a frame comes for another
    // peer, or stop().
    fds.clear();
    fds.push_back({wake_read_, POLLIN, 0});
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      bool other_work = false;
      for (size_t s = 0; s < slots_.size(); ++s) {
        const Slot& slot = slots_[s];
        if (slot.jobs.empty() || !slot.error.empty()) continue;
        if (std::find(active.begin(), active.end(), static_cast<int>(s)) == active.end()) other_work = true;
        else fds.push_back({slot.fd, POLLOUT, 0});
      }
      if (other_work) continue;
      polling_ = true;  // from here on, submit() writes the pipe
    }
    ::poll(fds.data(), fds.size(), -1);
    if (fds[0].revents & POLLIN) drain_wake_pipe(wake_read_);
  }
}

}  // namespace mccl
