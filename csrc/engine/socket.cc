#include "socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "error.h"

namespace mccl {

int ms_until(Deadline deadline, int cap_ms) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > cap_ms ? cap_ms : static_cast<int>(left);
}

std::string format_address(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "<unknown address family>";
}

sockaddr_storage parse_address(const std::string& text) {
  sockaddr_storage addr{};
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      fail(Error::Kind::kInvalidArgument, "cannot parse address '", text, "'");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos) fail(Error::Kind::kInvalidArgument, "cannot parse address '", text, "'");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  int port_number = std::atoi(port.c_str());
  if (port_number <= 0 || port_number > 65535) fail(Error::Kind::kInvalidArgument, "bad port in address '", text, "'");
  auto* in = reinterpret_cast<sockaddr_in*>(&addr);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, host.c_str(), &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port_number));
  } else if (inet_pton(AF_INET6, host.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port_number));
  } else {
    fail(Error::Kind::kInvalidArgument, "cannot parse host '", host, "' in address '", text, "'");
  }
  return addr;
}

static socklen_t address_length(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void Socket::shutdown_write() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

void Socket::set_nonblocking() {
  int flags = fcntl(fd_, F_GETFL, 0);
  if (flags < 0 || fcntl(fd_, F_SETFL, flags | O_NONBLOCK) < 0)
    fail(Error::Kind::kConnection, "fcntl(O_NONBLOCK) failed: ", std::strerror(errno));
  fcntl(fd_, F_SETFD, FD_CLOEXEC);
}

void Socket::configure_for_data(size_t buffer_bytes) {
  set_nonblocking();
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
#ifdef SO_NOSIGPIPE  // Darwin: Linux uses MSG_NOSIGNAL per call instead
  setsockopt(fd_, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#endif
  if (buffer_bytes > 0) {
    int size = static_cast<int>(buffer_bytes);  // fits: config.cc rejects MCCL_SOCKET_BUFFER_BYTES above INT_MAX
    setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  }
}

Socket Socket::connect_to(const sockaddr_storage& addr, Deadline deadline, const std::string& what) {
  std::string last_error = "no attempt";
  auto backoff = std::chrono::milliseconds(5);
  while (true) {
    Socket sock(::socket(addr.ss_family, SOCK_STREAM, 0));
    if (!sock.valid()) fail(Error::Kind::kConnection, "socket() failed: ", std::strerror(errno));
    sock.set_nonblocking();
    int rc = ::connect(sock.fd(), reinterpret_cast<const sockaddr*>(&addr), address_length(addr));
    if (rc == 0) return sock;
    if (errno == EINPROGRESS) {
      pollfd pfd{sock.fd(), POLLOUT, 0};
      int ready = ::poll(&pfd, 1, ms_until(deadline));
      if (ready > 0) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(sock.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) return sock;
        last_error = std::strerror(err);
      } else if (ready == 0) {
        last_error = "connect did not complete";
      } else if (errno != EINTR) {
        last_error = std::strerror(errno);
      }
    } else {
      last_error = std::strerror(errno);
    }
    if (Clock::now() + backoff >= deadline) {
      fail(Error::Kind::kTimeout, "could not connect to ", what, " (", format_address(addr), "): ", last_error,
           ". Is the peer running, and does a firewall allow the port?");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

void Socket::write_all(const void* data, size_t size, Deadline deadline, const std::string& what) {
  auto* p = static_cast<const char*>(data);
  while (size > 0) {
    iovec iov{const_cast<char*>(p), size};
    size_t n = send_some(&iov, 1);
    if (n == 0) {
      pollfd pfd{fd_, POLLOUT, 0};
      if (::poll(&pfd, 1, ms_until(deadline)) == 0 && Clock::now() >= deadline)
        fail(Error::Kind::kTimeout, "timed out sending to ", what, ": the connection took no more bytes before the "
             "deadline (the peer is not reading)");
      continue;
    }
    p += n;
    size -= n;
  }
}

void Socket::read_all(void* data, size_t size, Deadline deadline, const std::string& what) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    size_t n = recv_some(p, size);
    if (n == 0) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, ms_until(deadline)) == 0 && Clock::now() >= deadline)
        fail(Error::Kind::kTimeout, "timed out waiting for the handshake from ", what);
      continue;
    }
    p += n;
    size -= n;
  }
}

void make_wake_pipe(int* read_end, int* write_end) {
  int fds[2];
  if (::pipe(fds) != 0) fail(Error::Kind::kInternal, "pipe() failed: ", std::strerror(errno));
  for (int fd : fds) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  *read_end = fds[0];
  *write_end = fds[1];
}

void write_wake_pipe(int write_end) {
  char byte = 1;
  ssize_t ignored = ::write(write_end, &byte, 1);  // fails only when the pipe is full: awake already
  (void)ignored;
}

void drain_wake_pipe(int read_end) {
  char buf[64];
  while (::read(read_end, buf, sizeof(buf)) > 0) {
  }
}

size_t Socket::send_some(const struct iovec* iov, int iovcnt) { return send_some_on(fd_, iov, iovcnt); }

size_t Socket::send_some_on(int fd, const struct iovec* iov, int iovcnt) {
  msghdr msg{};
  msg.msg_iov = const_cast<struct iovec*>(iov);
  msg.msg_iovlen = iovcnt;
#ifdef MSG_NOSIGNAL
  const int flags = MSG_NOSIGNAL;
#else
  const int flags = 0;
#endif
  while (true) {
    ssize_t n = ::sendmsg(fd, &msg, flags);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    fail(Error::Kind::kConnection, "send failed: ", std::strerror(errno));
  }
}

size_t Socket::recv_some(void* data, size_t size) {
  while (true) {
    ssize_t n = ::recv(fd_, data, size, 0);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) fail(Error::Kind::kConnection, "Connection closed by peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    fail(Error::Kind::kConnection, "recv failed: ", std::strerror(errno));
  }
}

size_t Socket::recv_some(const struct iovec* iov, int iovcnt) {
  msghdr msg{};
  msg.msg_iov = const_cast<struct iovec*>(iov);
  msg.msg_iovlen = iovcnt;
  while (true) {
    ssize_t n = ::recvmsg(fd_, &msg, 0);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) fail(Error::Kind::kConnection, "Connection closed by peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    fail(Error::Kind::kConnection, "recv failed: ", std::strerror(errno));
  }
}

sockaddr_storage Socket::local_address() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr;
}

sockaddr_storage Socket::peer_address() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  return addr;
}

}  // namespace mccl
