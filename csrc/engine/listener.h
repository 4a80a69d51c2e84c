// The listening socket a rank's peers connect to during rendezvous (closed when rendezvous ends, so a
// running job has no open port). accept() always has a deadline.
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

  // Accepts one connection before `deadline`, or throws kTimeout with `waiting_for` in the message.
  Socket accept(Deadline deadline, const std::string& waiting_for);

  // One non-blocking accept: a non-blocking, close-on-exec socket, or an invalid one when none is waiting.
  Socket try_accept();
  int fd() const { return sock_.fd(); }

 private:
  Socket sock_;
  std::string address_;
};

}  // namespace mccl
