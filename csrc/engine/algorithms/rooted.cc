// Collectives with a root: broadcast, reduce, gather, scatter.
#include <cstring>

#include "../reduce.h"
#include "algorithms.h"
#include "select.h"

namespace mccl {
namespace {

// Ranks renumbered so the root is 0; binomial trees are built on these.
struct Relative {
  int n, root;
  int of(int rank) const { return (rank - root + n) % n; }
  int real(int relative) const { return (relative + root) % n; }
};

// Whether select.cc picks the binomial tree for this broadcast or reduce.
bool tree(const Collective& c, CollectiveKind kind, size_t count) {
  return select_algorithm(c.config(), kind, c.size(), count * dtype_size(c.dtype()), count) == AlgoChoice::kTree;
}

}  // namespace

// Small: binomial tree, log2(n) rounds; in round k every rank that has the data sends it 2^k ranks on.
// Large: the root scatters one segment to each rank, then a ring all-gather completes everyone
// (van de Geijn), so the root's link carries about 2x the buffer instead of (n-1)x.
void broadcast(Collective& c, void* buf, size_t count, int root) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  const size_t esize = dtype_size(c.dtype()), bytes = count * esize;
  char* data = static_cast<char*>(buf);
  if (tree(c, CollectiveKind::kBroadcast, count)) {
    const Relative rel{n, root};
    const int vr = rel.of(r);
    int mask = 1;
    while (mask < n) {
      if (vr & mask) {
        c.wait(c.recv(rel.real(vr - mask), data, bytes, 0, 0));
        break;
      }
      mask <<= 1;
    }
    std::vector<RequestPtr> sends;
    for (mask >>= 1; mask > 0; mask >>= 1) {
      if (vr + mask < n) sends.push_back(c.send(rel.real(vr + mask), data, bytes, 0, 0));
    }
    c.wait_all(sends);
    return;
  }
  auto segs = even_segments(data, count, esize, n);
  if (r == root) {
    std::vector<RequestPtr> sends;
    for (int k = 0; k < n; ++k) {
      if (k != root) sends.push_back(c.send(k, segs[k].data, segs[k].bytes, segs[k].offset, 0));
    }
    c.wait_all(sends);  // the all-gather below writes these segments again (with the same bytes)
  } else {
    c.wait(c.recv(root, segs[r].data, segs[r].bytes, segs[r].offset, 0));
  }
  ring_allgather(c, segs, 1);
}

// Small: binomial tree towards the root; in round k ranks whose bit k is set send their partial
// result 2^k ranks down and drop out. Large: ring reduce-scatter, then every rank sends its reduced
// segment to the root. Non-root buffers are never modified.
void reduce(Collective& c, void* buf, size_t count, int root) {
  const int n = c.size(), r = c.rank();
  const size_t esize = dtype_size(c.dtype()), bytes = count * esize;
  char* data = static_cast<char*>(buf);
  char* acc = n > 1 && r != root ? c.scratch(1, bytes) : data;  // partial sums of a non-root rank
  if (n > 1 && tree(c, CollectiveKind::kReduce, count)) {
    if (bytes && acc != data) std::memcpy(acc, data, bytes);
    const Relative rel{n, root};
    const int vr = rel.of(r);
    for (int mask = 1; mask < n; mask <<= 1) {
      if (vr & mask) {
        c.wait(c.send(rel.real(vr - mask), acc, bytes, 0, 0));
        break;
      }
      if (vr + mask < n) {
        auto in = c.recv_to_reduce(rel.real(vr + mask), bytes, 0, 0);
        c.wait(in);
        c.reduce_received(acc, in, bytes);
      }
    }
  } else if (n > 1) {
    auto segs = even_segments(acc, count, esize, n);
    if (acc != data)  // the ring reads this rank's values where they are, as it needs them
      for (Segment& seg : segs) seg.own = data + seg.offset;
    ring_reduce_scatter(c, segs, 0);
    const uint32_t gather_step = static_cast<uint32_t>(n);
    if (r == root) {
      std::vector<RequestPtr> recvs;
      for (int k = 0; k < n; ++k) {
        if (k != root) recvs.push_back(c.recv(k, segs[k].data, segs[k].bytes, segs[k].offset, gather_step));
      }
      c.wait_all(recvs);
    } else {
      c.wait(c.send(root, segs[r].data, segs[r].bytes, segs[r].offset, gather_step));
    }
  }
  if (r == root && c.op() == ReduceOp::kAvg) divide_by(data, count, c.dtype(), n);
}

void gather(Collective& c, const void* in, size_t bytes, const std::vector<char*>& outs, int root) {
  const int n = c.size(), r = c.rank();
  if (r != root) {
    c.wait(c.send(root, in, bytes, 0, 0));
    return;
  }
  std::vector<RequestPtr> recvs;
  for (int k = 0; k < n; ++k) {
    if (k != root) recvs.push_back(c.recv(k, outs[k], bytes, 0, 0));
  }
  if (bytes && outs[root] != in) std::memmove(outs[root], in, bytes);
  c.wait_all(recvs);
}

void scatter(Collective& c, const std::vector<const char*>& ins, void* out, size_t bytes, int root) {
  const int n = c.size(), r = c.rank();
  if (r != root) {
    c.wait(c.recv(root, out, bytes, 0, 0));
    return;
  }
  std::vector<RequestPtr> sends;
  for (int k = 0; k < n; ++k) {
    if (k != root) sends.push_back(c.send(k, ins[k], bytes, 0, 0));
  }
  if (bytes && ins[root] != out) std::memmove(out, ins[root], bytes);
  c.wait_all(sends);
}

}  // namespace mccl
