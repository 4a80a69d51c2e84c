// The frame cursor: the bytes one lane carries of one frame (a "segment": a head, then that lane's share of the
// payload), how far they are written, and the two operations every writer needs: fill iovecs with what
// is left of a run of cursors, and count what one sendmsg() took. The progress thread (Peer::write), the
// sender threads (Sender) and the abort path (write_rest) all write through these, and only these.
//
// The head is the frame's FrameHeader on lane 0 and a LaneHeader on the other lanes (wire.h). Cursors are
// copied between threads (a sender works on a copy of its queue's front): the lane header lives in the
// cursor itself, the frame header and the payload in the Request it shares.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "socket.h"
#include "transport/request.h"

namespace mccl {

constexpr int kMaxIov = 16;  // iovecs per sendmsg(): the head and payload of up to 8 segments

struct FrameCursor {
  RequestPtr request;
  LaneHeader lane_header;  // the head on lanes 1..nsocks-1
  bool frame_head = true;  // lane 0: the head is request->header
  const char* data = nullptr;
  size_t bytes = 0;        // payload bytes of this share
  size_t progress = 0;     // head + payload bytes written

  size_t head_bytes() const { return frame_head ? sizeof(FrameHeader) : sizeof(LaneHeader); }
  const char* head() const {
    return frame_head ? reinterpret_cast<const char*>(&request->header) : reinterpret_cast<const char*>(&lane_header);
  }
  size_t size() const { return head_bytes() + bytes; }
  size_t left() const { return size() - progress; }

  // What is left to write, as at most two iovecs (the rest of the head, the rest of the payload).
  int fill(iovec* iov) const {
    int n = 0;
    const size_t head_size = head_bytes();
    if (progress < head_size) iov[n++] = {const_cast<char*>(head()) + progress, head_size - progress};
    const size_t done = progress > head_size ? progress - head_size : 0;
    if (done < bytes) iov[n++] = {const_cast<char*>(data) + done, bytes - done};
    return n;
  }
};

// A whole frame on lane 0: its header and all of its payload (a frame that is not split: an abort; tests).
inline FrameCursor whole_frame(RequestPtr request) {
  FrameCursor s;
  s.data = request->data;
  s.bytes = request->length;
  s.request = std::move(request);
  return s;
}

// Fills iov (room for kMaxIov) with what is left of cursors [first, last), in order; returns the count.
template <class It>
int gather(It first, It last, iovec* iov) {
  int n = 0;
  for (It it = first; it != last && n + 2 <= kMaxIov; ++it) n += it->fill(iov + n);
  return n;
}

// Counts `written` bytes (one sendmsg() of gather()'s iovecs) against the cursors from `first` on;
// returns how many of them it finished (they are the first ones).
template <class It>
size_t advance(It first, size_t written) {
  size_t finished = 0;
  for (It it = first; written > 0; ++it) {
    const size_t take = std::min(written, it->left());
    it->progress += take;
    written -= take;
    if (it->left() == 0) ++finished;
  }
  return finished;
}

// Blocking (bounded by the deadline): writes what is left of `cursor`. For the abort path, which must
// finish a half-written frame before its own. Throws kTimeout / kConnection naming `what`.
void write_rest(Socket& sock, FrameCursor& cursor, Deadline deadline, const std::string& what);

}  // namespace mccl
