#include "transport/frame_cursor.h"

namespace mccl {

void write_rest(Socket& sock, FrameCursor& segment, Deadline deadline, const std::string& what) {
  iovec iov[2];
  const int n = segment.fill(iov);
  for (int k = 0; k < n; ++k) {
    sock.write_all(iov[k].iov_base, iov[k].iov_len, deadline, what);
    advance(&segment, iov[k].iov_len);
  }
}

}  // namespace mccl
