// The listening socket a rank's peers connect to during rendezvous (closed when rendezvous ends, so a
// running job has no open port). Accepting is non-blocking: bootstrap.cc polls it together with the
// connections that are still proving themselves.
#pragma once

#include <string>

#include "socket.h"

namespace mccl {

class Listener {
 public:
  // Binds `host` (numeric IPv4/IPv6) on an ephemeral port. Throws kConnection.
  Listener(const std::string& host, int backlog);

  // "host:port" that peers should connect to.
  const std::string& address() const { return address_; }

  // One non-blocking accept: a non-blocking, close-on-exec socket, or an invalid one when none is waiting.
  Socket try_accept();
  int fd() const { return sock_.fd(); }

 private:
  Socket sock_;
  std::string address_;
};

}  // namespace mccl
