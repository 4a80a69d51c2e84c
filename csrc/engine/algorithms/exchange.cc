// Everyone-to-everyone collectives: all-gather, reduce-scatter, all-to-all, barrier.
#include <cstring>

#include "../reduce.h"
#include "algorithms.h"

namespace mccl {

void allgather(Collective& c, const void* in, size_t count, const std::vector<char*>& outs) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = count * dtype_size(c.dtype());
  if (bytes && outs[r] != in) std::memmove(outs[r], in, bytes);
  std::vector<Segment> segs(n);
  for (int k = 0; k < n; ++k) segs[k] = {outs[k], bytes, static_cast<uint64_t>(k) * bytes};
  ring_allgather(c, segs, 0);
}

void reduce_scatter(Collective& c, const void* in, size_t count, void* out) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = count * dtype_size(c.dtype());
  char* work = c.scratch(1, bytes * n);
  if (bytes) std::memcpy(work, in, bytes * n);
  std::vector<Segment> segs(n);
  for (int k = 0; k < n; ++k) segs[k] = {work + k * bytes, bytes, static_cast<uint64_t>(k) * bytes};
  ring_reduce_scatter(c, segs, 0);
  if (bytes) std::memcpy(out, segs[r].data, bytes);
  if (c.op() == ReduceOp::kAvg) divide_by(out, count, c.dtype(), n);
}

// Every rank posts all its receives, then sends to rank+1, rank+2, ... so that at any moment the
// ranks are sending to different destinations instead of all to rank 0 first.
void alltoall(Collective& c, const void* in, const std::vector<size_t>& send_counts, void* out,
              const std::vector<size_t>& recv_counts) {
  const int n = c.size(), r = c.rank();
  const size_t esize = dtype_size(c.dtype());
  std::vector<size_t> send_at(n, 0), recv_at(n, 0);
  for (int k = 1; k < n; ++k) {
    send_at[k] = send_at[k - 1] + send_counts[k - 1] * esize;
    recv_at[k] = recv_at[k - 1] + recv_counts[k - 1] * esize;
  }
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  std::vector<RequestPtr> requests;
  for (int k = 0; k < n; ++k) {
    if (k != r) requests.push_back(c.recv_counted(k, dst + recv_at[k], recv_counts[k] * esize, recv_counts[k], 0));
  }
  for (int i = 1; i < n; ++i) {
    int k = (r + i) % n;
    requests.push_back(c.send_counted(k, src + send_at[k], send_counts[k] * esize, send_counts[k], 0));
  }
  if (send_counts[r]) std::memmove(dst + recv_at[r], src + send_at[r], send_counts[r] * esize);
  c.wait_all(requests);
}

// Dissemination barrier: in round k every rank signals rank+2^k and waits for rank-2^k. After
// ceil(log2 n) rounds every rank has (transitively) heard from every other, so none leaves early.
void barrier(Collective& c) {
  const int n = c.size(), r = c.rank();
  uint32_t round = 0;
  for (int distance = 1; distance < n; distance <<= 1, ++round) {
    auto in = c.recv((r - distance + n) % n, nullptr, 0, 0, round);
    auto out = c.send((r + distance) % n, nullptr, 0, 0, round);
    c.wait(in);
    c.wait(out);
  }
}

}  // namespace mccl
