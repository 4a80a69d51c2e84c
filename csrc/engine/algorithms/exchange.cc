// Everyone-to-everyone collectives: all-gather, reduce-scatter, all-to-all, barrier.
#include <algorithm>
#include <cstring>

#include "../reduce.h"
#include "algorithms.h"
#include "select.h"

namespace mccl {

void allgather(Collective& c, const void* in, size_t count, const std::vector<char*>& outs) {
  const size_t gathered = count * dtype_size(c.dtype()) * static_cast<size_t>(c.size());
  if (select_algorithm(c.config(), CollectiveKind::kAllgather, c.size(), gathered, count) == AlgoChoice::kBruck)
    allgather_bruck(c, in, count, outs);
  else
    allgather_ring(c, in, count, outs);
}

void allgather_ring(Collective& c, const void* in, size_t count, const std::vector<char*>& outs) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = count * dtype_size(c.dtype());
  if (bytes && outs[r] != in) std::memmove(outs[r], in, bytes);
  std::vector<Segment> segs(n);
  for (int k = 0; k < n; ++k) segs[k] = {outs[k], bytes, static_cast<uint64_t>(k) * bytes};
  ring_allgather(c, segs, 0);
}

// Bruck's all-gather: ceil(log2 n) steps for any n, one message per rank per step. The blocks are
// gathered in scratch in rotated order: slot i holds rank (r+i) mod n's block, so slot 0 is this rank's
// own. In the step at distance d = 1, 2, 4, ... every rank sends its first min(d, n-d) slots to rank
// r-d and receives as many from rank r+d into slots d onwards (that rank's first slots are blocks
// r+d, r+d+1, ...). After the last step all n slots are filled; they are copied out in rank order.
// Each message's offset is its first block's rank times the block size, the same on both ends.
void allgather_bruck(Collective& c, const void* in, size_t count, const std::vector<char*>& outs) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = count * dtype_size(c.dtype());
  char* slots = c.scratch(0, bytes * static_cast<size_t>(n));
  if (bytes) std::memcpy(slots, in, bytes);
  uint32_t step = 0;
  for (int d = 1; d < n; d <<= 1, ++step) {
    const size_t blocks = static_cast<size_t>(std::min(d, n - d));
    const int from = (r + d) % n, to = (r - d + n) % n;
    auto got = c.recv(from, slots + static_cast<size_t>(d) * bytes, blocks * bytes,
                      static_cast<uint64_t>(from) * bytes, step);
    auto sent = c.send(to, slots, blocks * bytes, static_cast<uint64_t>(r) * bytes, step);
    c.wait(got);
    c.wait(sent);
  }
  if (bytes == 0) return;
  for (int i = 0; i < n; ++i) std::memcpy(outs[(r + i) % n], slots + static_cast<size_t>(i) * bytes, bytes);
}

void reduce_scatter(Collective& c, const void* in, size_t count, void* out) {
  const size_t input = count * dtype_size(c.dtype()) * static_cast<size_t>(c.size());
  if (select_algorithm(c.config(), CollectiveKind::kReduceScatter, c.size(), input, count) ==
      AlgoChoice::kRecursiveDoubling)
    reduce_scatter_recursive_doubling(c, in, count, out);
  else
    reduce_scatter_ring(c, in, count, out);
}

// The ring reduce-scatter reads each block of the input where it is, when it first needs it, and sums into
// scratch, this rank's own block into `out`: no copy of the input before the first piece is on the wire.
void reduce_scatter_ring(Collective& c, const void* in, size_t count, void* out) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = count * dtype_size(c.dtype());
  const char* input = static_cast<const char*>(in);
  if (n == 1) {
    if (bytes && out != in) std::memmove(out, in, bytes);
    return;
  }
  char* work = c.scratch(1, bytes * n);
  std::vector<Segment> segs(n);
  for (int k = 0; k < n; ++k) {
    char* sum = k == r ? static_cast<char*>(out) : work + k * bytes;
    segs[k] = {sum, bytes, static_cast<uint64_t>(k) * bytes, input + k * bytes};
  }
  ring_reduce_scatter(c, segs, 0);
  if (c.op() == ReduceOp::kAvg) divide_by(out, count, c.dtype(), n);
}

// For small inputs: the whole input allreduced by recursive doubling (log2(n) steps, the fold for
// other world sizes included), then this rank keeps its block. It sends log2(n) times the input where
// the ring sends (n-1)/n of it, in n-1 steps.
void reduce_scatter_recursive_doubling(Collective& c, const void* in, size_t count, void* out) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = count * dtype_size(c.dtype());
  char* work = c.scratch(1, bytes * n);
  if (bytes) std::memcpy(work, in, bytes * n);
  allreduce_recursive_doubling(c, work, count * static_cast<size_t>(n));
  if (bytes) std::memcpy(out, work + static_cast<size_t>(r) * bytes, bytes);
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
