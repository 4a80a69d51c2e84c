// The listening socket a rank's peers connect to during rendezvous (closed when rendezvous ends, so a
// running job has no open port). Accepting is non-blocking: bootstrap.cc polls it together with the
// connections that are still proving themselves.
#pragma once

#include <cstdint>
#include <string>

#include "socket.h"

namespace mccl {

class Listener {
 public:
  // Binds `host` (numeric IPv4/IPv6) on an ephemeral port, or, when port_min > 0, on the lowest port of
  // port_min..port_max that is free (MCCL_PORT_RANGE). Throws kConnection (kInvalidArgument when the
  // whole range is in use).
  Listener(const std::string& host, int backlog, uint16_t port_min = 0, uint16_t port_max = 0);

  // "host:port" that peers should connect to.
  const std::string& address() const { return address_; }

  // One non-blocking accept: a non-blocking, close-on-exec socket, or an invalid one when none is waiting.
  Socket try_accept();
  int fd() const { return sock_.fd(); }

 private:
  // Binds and listens on `port` (0: ephemeral); false when the port is taken (EADDRINUSE), throws otherwise.
  bool try_listen(const std::string& host, sockaddr_storage addr, uint16_t port, int backlog);

  Socket sock_;
  std::string address_;
};

}  // namespace mccl
