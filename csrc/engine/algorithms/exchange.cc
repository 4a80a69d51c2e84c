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

// The all-to-all moves one block between every ordered pair of ranks: rank r's block for rank k (send_counts[k]
// elements, after the blocks for ranks 0 .. k-1) lands in rank k's output block r. Each block is one frame,
// its element count in the header (blocks of any size, zero included), and there is one frame per ordered
// pair, so receives match whatever order either end posts in. MCCL_ALLTOALL_WINDOW chooses that order:
//
//   0 (the default): every receive is posted, then a send to rank r+1, r+2, ..., r+n-1: at any moment the
//     ranks send to different destinations instead of all to rank 0 first, and every link stays busy
//     whichever rank is late.
//   W >= 1: MPI's pairwise exchange. In round i = 1 .. n-1 rank r receives rank r-i's block and sends its block
//     for rank r+i (which receives it in its own round i). Rounds 1 .. W are posted at once, and round i+W
//     once round i's send and receive are done (MCCL_ALLTOALL_WINDOW_GATE=send: once its send is written,
//     the receives awaited at the end), so each rank has at most W sends outstanding (and, gated on both, W
//     receives). W >= n-1 posts every round at once, in that order.
//
// This rank's own block is copied while the first frames travel. The schedule changes no frame, so ranks
// with different windows still exchange correctly.
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
  auto recv_from = [&](int k) { return c.recv_counted(k, dst + recv_at[k], recv_counts[k] * esize, recv_counts[k], 0); };
  auto send_to = [&](int k) { return c.send_counted(k, src + send_at[k], send_counts[k] * esize, send_counts[k], 0); };
  const int rounds = n - 1;
  const int window = static_cast<int>(std::min<size_t>(c.config().alltoall_window, static_cast<size_t>(rounds)));
  // In the pairwise exchange, round i's receive is requests[2(i-1)] and its send requests[2(i-1)+1].
  std::vector<RequestPtr> requests;
  auto post_round = [&](int i) {
    requests.push_back(recv_from((r - i + n) % n));
    requests.push_back(send_to((r + i) % n));
  };
  if (window == 0) {
    for (int k = 0; k < n; ++k)
      if (k != r) requests.push_back(recv_from(k));
    for (int i = 1; i <= rounds; ++i) requests.push_back(send_to((r + i) % n));
  } else {
    for (int i = 1; i <= window; ++i) post_round(i);
  }
  if (send_counts[r]) std::memmove(dst + recv_at[r], src + send_at[r], send_counts[r] * esize);
  for (int i = 1; window > 0 && i + window <= rounds; ++i) {
    c.wait(requests[2 * (i - 1) + 1]);
    if (!c.config().alltoall_gate_send) c.wait(requests[2 * (i - 1)]);
    post_round(i + window);
  }
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
