// A TCP socket: RAII ownership of the fd, the options MCCL needs, and deadline-bounded helpers for the
// connection handshake and the abort frame. The data path (transport.cc) uses the non-blocking send_some /
// recv_some.
// Portable POSIX: Linux-only and Darwin-only options are behind #ifdef.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <string>

namespace mccl {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Milliseconds left until the deadline, clamped to [0, cap_ms]; for poll().
int ms_until(Deadline deadline, int cap_ms = 1 << 30);

// "10.0.0.2:41234" / "[fe80::1]:41234"
std::string format_address(const sockaddr_storage& addr);
// Parses "host:port" or "[v6]:port" (numeric hosts only). Throws kInvalidArgument.
sockaddr_storage parse_address(const std::string& text);

// A non-blocking, close-on-exec pipe: how a thread blocked in poll() is woken (a byte written to write_end).
void make_wake_pipe(int* read_end, int* write_end);
// Writes the byte (thread-safe; a full pipe already means "wake up").
void write_wake_pipe(int write_end);
// Reads the pipe empty, on the woken thread.
void drain_wake_pipe(int read_end);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();
  // shutdown(SHUT_RDWR): wakes a peer blocked on this connection without giving up the fd yet.
  void shutdown();
  // shutdown(SHUT_WR): sends FIN after whatever is queued (an abort frame), keeps reading possible.
  void shutdown_write();

  // Non-blocking, close-on-exec, no SIGPIPE, TCP_NODELAY, optional buffer sizes.
  void configure_for_data(size_t buffer_bytes);
  void set_nonblocking();

  // Connects to `addr` before `deadline`, retrying refused/unreachable attempts (the peer's listener
  // may not be up yet). Throws kTimeout naming `what` (e.g. "rank 3 at 10.0.0.4:5000").
  static Socket connect_to(const sockaddr_storage& addr, Deadline deadline, const std::string& what);

  // Whole-buffer I/O on a non-blocking socket, waiting with poll() until the deadline. Throw
  // kTimeout / kConnection with `what` in the message. read_all is used only during the handshake;
  // write_all also on the abort path (write_rest in frame_cursor.h: the rest of a half-sent frame, then
  // the abort frame).
  void write_all(const void* data, size_t size, Deadline deadline, const std::string& what);
  void read_all(void* data, size_t size, Deadline deadline, const std::string& what);

  // One non-blocking attempt. Returns bytes moved (>0), 0 when the call would block.
  // recv_some throws kConnection when the peer closed; both throw kConnection on socket errors.
  size_t send_some(const struct iovec* iov, int iovcnt);
  static size_t send_some_on(int fd, const struct iovec* iov, int iovcnt);  // for the sender thread
  size_t recv_some(void* data, size_t size);
  size_t recv_some(const struct iovec* iov, int iovcnt);  // scatter: fills iov[0] first

  sockaddr_storage local_address() const;
  sockaddr_storage peer_address() const;

 private:
  int fd_ = -1;
};

}  // namespace mccl
