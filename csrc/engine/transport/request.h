// A send or a receive posted to the transport: what algorithms hold and wait on. Owned by a shared_ptr,
// so the progress thread, a sender thread and the algorithm that posted it can all keep it alive.
// Every field is read and written on the progress thread, except that a sender thread reads the header
// and the payload of a send while it writes them.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>

#include "wire.h"

namespace mccl {

constexpr int kAnySource = -1;

struct Request {
  enum class Type { kSend, kRecv } type = Type::kSend;
  int peer = 0;            // kAnySource for a receive from whoever sends first
  FrameHeader header;      // what to send, or what the receive expects
  char* data = nullptr;
  size_t length = 0;
  int parts_left = 0;      // send: lanes still writing their share of it (transport/peer.h)
  bool done = false;
  int source = -1;         // receive: the rank it matched
  // Called once on the progress thread when the request completes (nullptr) or fails.
  std::function<void(const Request&, std::exception_ptr)> on_done;
};
using RequestPtr = std::shared_ptr<Request>;

// Marks it done and runs its callback (once).
inline void complete(const RequestPtr& request, std::exception_ptr error = nullptr) {
  if (!error) request->done = true;
  if (request->on_done) {
    auto callback = std::move(request->on_done);
    request->on_done = nullptr;
    callback(*request, error);
  }
}

}  // namespace mccl
