// The matcher: which receive each incoming frame belongs to. Owned and run by the progress thread.
//
// A frame is matched by (source, channel, seq) alone, in posting order on both sides (FIFO per peer, like
// MPI): the first posted receive with that key, or else the frame is kept as "unexpected" until one is
// posted. Lanes never appear here: a frame's header travels on lane 0 and the peer (peer.h) puts the
// payload, from whichever lanes carry it, where the matcher said. A frame may be matched while its payload
// is still arriving (into the receive, or into an unexpected frame's buffer that a receive then claims).
//
// Every match is validated: the received header is compared with the one the receive expects (kind,
// dtype, count, op, root, offset, length, ...) before any payload is read, so a mismatched collective is
// an error naming both sides, not corrupt data. After a collective, a frame of it (or of an earlier one)
// still unmatched means the ranks called different collectives: check_strays().
//
// Unexpected frames land in recycled heap buffers that grow as their bytes arrive, so a header that
// claims a huge length commits memory only for bytes that really came.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "transport/request.h"

namespace mccl {

class Matcher {
 public:
  struct Buffer {
    std::unique_ptr<char[]> bytes;
    size_t capacity = 0;
    char* data() const { return bytes.get(); }
  };
  struct Unexpected {
    int source = -1;
    FrameHeader header;
    Buffer buffer;
    bool arrived = false;  // all of its payload is in
    RequestPtr claimed;    // the receive it belongs to, posted while its payload was still arriving
  };
  using Stash = std::list<Unexpected>::iterator;

  // peer_name(rank) -> "rank 3 (10.0.0.4:5123)", for messages.
  Matcher(int rank, std::function<std::string(int)> peer_name) : rank_(rank), peer_name_(std::move(peer_name)) {}

  // A receive is posted: it completes now from a frame that already arrived, claims one still arriving,
  // or waits for its frame. Throws kMismatch.
  void post(const RequestPtr& request);
  // A frame's header arrived from `source` (already checked by check_frame_header): the posted receive
  // it is for, taken off the list, or nullptr. Throws kMismatch.
  RequestPtr claim(int source, const FrameHeader& h);
  // Nobody asked for it yet: a new unexpected frame its payload goes into.
  Stash stash(int source, const FrameHeader& h);
  // Where byte `pos` of a stashed frame's payload goes; *room: how many bytes from there fit.
  char* place(Stash u, uint64_t pos, uint64_t* room);
  // All of a stashed frame's payload is in.
  void arrived(Stash u);

  // Whether a posted receive names `source` (so its closing the connection is an error).
  bool waits_for(int source) const;
  // After collective #seq completed here. Throws kMismatch naming the frame nobody expected.
  void check_strays(uint64_t seq) const;
  // After a fatal error: every posted or claiming receive into *pending; everything is dropped.
  void drop_all(std::vector<RequestPtr>* pending);

 private:
  bool matches(const Request& r, int source, const FrameHeader& h) const;
  void validate(const Request& r, const FrameHeader& h, int source) const;
  void deliver(Unexpected& u, const RequestPtr& request);
  Buffer take_buffer(size_t size);
  void recycle(Buffer buffer);

  int rank_;
  std::function<std::string(int)> peer_name_;
  std::list<RequestPtr> posted_;      // in posting order
  std::list<Unexpected> unexpected_;  // in the order their headers arrived
  std::vector<Buffer> spare_buffers_;  // recycled Unexpected buffers
  size_t spare_bytes_ = 0;             // their capacity, at most 8 MiB
};

}  // namespace mccl
