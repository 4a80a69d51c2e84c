#include "listener.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "error.h"

namespace mccl {

Listener::Listener(const std::string& host, int backlog, uint16_t port_min, uint16_t port_max) {
  std::string bracketed = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  sockaddr_storage addr = parse_address(bracketed + ":1");
  bool bound = false;
  if (port_min == 0) {
    bound = try_listen(host, addr, 0, backlog);
  } else {
    for (uint32_t port = port_min; port <= port_max && !bound; ++port)
      bound = try_listen(host, addr, static_cast<uint16_t>(port), backlog);
  }
  if (!bound) {
    const uint32_t count = port_max - port_min + 1u;
    fail(Error::Kind::kInvalidArgument, "cannot listen on ", host, ": all ", count, " port(s) of MCCL_PORT_RANGE=",
         port_min, "-", port_max, " are in use (every rank on a host needs its own port while connecting, "
         "and other programs may hold some): widen the range");
  }
  sock_.set_nonblocking();
  address_ = format_address(sock_.local_address());
}

bool Listener::try_listen(const std::string& host, sockaddr_storage addr, uint16_t port, int backlog) {
  if (addr.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(port);
  else reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(port);
  sock_ = Socket(::socket(addr.ss_family, SOCK_STREAM, 0));
  if (!sock_.valid()) fail(Error::Kind::kConnection, "socket() failed: ", std::strerror(errno));
  int one = 1;
  setsockopt(sock_.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::bind(sock_.fd(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    if (errno == EADDRINUSE && port != 0) return false;
    fail(Error::Kind::kConnection, "cannot listen on ", host, ": bind failed: ", std::strerror(errno),
         " (is this address assigned to a local interface? see MCCL_SOCKET_IFNAME)");
  }
  if (::listen(sock_.fd(), backlog) != 0) {
    if (errno == EADDRINUSE && port != 0) return false;
    fail(Error::Kind::kConnection, "listen on ", host, " failed: ", std::strerror(errno));
  }
  return true;
}

Socket Listener::try_accept() {
  while (true) {
    int fd = ::accept(sock_.fd(), nullptr, nullptr);
    if (fd >= 0) {
      Socket sock(fd);
      sock.set_nonblocking();
      return sock;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Socket();
    // A connection that failed before we took it (reset, or a network error Linux reports here):
    // it is gone from the queue, take the next.
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == ENETDOWN || errno == ENETUNREACH ||
        errno == EHOSTDOWN || errno == EHOSTUNREACH || errno == ENOPROTOOPT || errno == EOPNOTSUPP)
      continue;
    // Out of file descriptors (EMFILE/ENFILE) and the like: report, do not spin.
    fail(Error::Kind::kConnection, "accept on ", address_, " failed: ", std::strerror(errno));
  }
}

}  // namespace mccl
