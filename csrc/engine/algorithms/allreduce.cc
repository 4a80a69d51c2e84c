// Allreduce: the ring (reduce-scatter, then all-gather) for bandwidth, recursive doubling for latency.
#include <cstring>

#include "../reduce.h"
#include "algorithms.h"
#include "select.h"

namespace mccl {

namespace {
constexpr uint32_t kUnfoldStep = 0xFFFF;  // header step of the unfold message, after every doubling step
}  // namespace

// Recursive doubling sends the whole buffer log2(n) times but takes only log2(n) steps; the ring sends
// 2(n-1)/n of it in 2(n-1) steps. select.cc holds where one overtakes the other. (The 8-bit allreduce has its
// own algorithms, int8_allreduce.cc.)
void allreduce(Collective& c, void* buf, size_t count) {
  const size_t bytes = count * dtype_size(c.dtype());
  switch (select_algorithm(c.config(), CollectiveKind::kAllreduce, c.size(), bytes, count)) {
    case AlgoChoice::kRing: return allreduce_ring(c, buf, count);
    default: return allreduce_recursive_doubling(c, buf, count);
  }
}

void allreduce_ring(Collective& c, void* buf, size_t count) {
  ring_allreduce(c, even_segments(static_cast<char*>(buf), count, dtype_size(c.dtype()), c.size()));
}

// Recursive doubling with the standard fold for non-powers of two. Let p be the largest power of two
// <= n and x = n - p. Fold: among the first 2x ranks, each even rank sends its buffer to the odd rank
// above it and sits out. The p remaining ranks (renumbered 0..p-1) exchange full buffers with the
// partner whose new number differs in bit k, for k = 0..log2(p)-1, reducing after each exchange.
// Unfold: each odd rank of the first 2x hands the result back to its even partner. Reductions are
// commutative, so both partners compute bit-identical results and every rank ends with the same bytes.
// With wire compression every rank rounds its operand before each exchange and its result at the end.
void allreduce_recursive_doubling(Collective& c, void* buf, size_t count) {
  const int n = c.size(), r = c.rank();
  const size_t bytes = count * dtype_size(c.dtype());
  char* data = static_cast<char*>(buf);
  if (n > 1) {
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const int extra = n - p;
    uint32_t step = 0;

    int new_rank;
    if (r < 2 * extra) {
      if (r % 2 == 0) {
        auto sent = c.send(r + 1, data, bytes, 0, step);
        auto back = c.recv(r + 1, data, bytes, 0, kUnfoldStep);
        c.wait(sent);
        c.wait(back);
        new_rank = -1;
      } else {
        auto in = c.recv_to_reduce(r - 1, bytes, 0, step);
        c.wait(in);
        c.reduce_received(data, in, bytes);
        new_rank = r / 2;
      }
    } else {
      new_rank = r - extra;
    }
    ++step;

    if (new_rank >= 0) {
      auto real_rank = [extra](int v) { return v < extra ? v * 2 + 1 : v + extra; };
      for (int mask = 1; mask < p; mask <<= 1, ++step) {
        int partner = real_rank(new_rank ^ mask);
        c.keep_as_sent(data, bytes);  // both partners then add the same two operands
        auto in = c.recv_to_reduce(partner, bytes, 0, step);
        auto out = c.send(partner, data, bytes, 0, step);
        c.wait(in);
        c.wait(out);  // `data` is about to change: the send must have left it
        c.reduce_received(data, in, bytes);
      }
      c.keep_as_sent(data, bytes);  // what the folded-out ranks will receive
      if (r < 2 * extra) c.wait(c.send(r - 1, data, bytes, 0, kUnfoldStep));
    }
  }
  // Every rank divides its own copy; the unfold above sent the undivided sum.
  if (c.op() == ReduceOp::kAvg) divide_by(data, count, c.dtype(), n);
}

}  // namespace mccl
