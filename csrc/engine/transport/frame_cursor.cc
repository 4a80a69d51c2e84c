#include "transport/frame_cursor.h"

namespace mccl {

void write_rest(Socket& sock, FrameCursor& cursor, Deadline deadline, const std::string& what) {
  iovec iov[2];
  const int n = cursor.fill(iov);
  for (int k = 0; k < n; ++k) {
    sock.write_all(iov[k].iov_base, iov[k].iov_len, deadline, what);
    advance(&cursor, iov[k].iov_len);
  }
}

}  // namespace mccl
