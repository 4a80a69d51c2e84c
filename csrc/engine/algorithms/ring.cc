// Ring reduce-scatter and all-gather, pipelined in pieces of MCCL_CHUNK_BYTES.
//
// Ranks form a ring: each sends only to its right neighbour (rank+1) and receives only from its
// left (rank-1), so every link carries the same load and the total traffic per rank is
// 2(n-1)/n of the buffer for an allreduce: bandwidth-optimal.
//
// Reduce-scatter schedule, n ranks, buffer in n segments: at step s (0 <= s < n-1) rank r sends
// segment (r-s-1) and receives segment (r-s-2), which it reduces into its own copy. What it receives
// at step s is what it sends at step s+1, so after n-1 steps segment r holds everyone's
// contribution. Each segment moves as pieces: a piece received at step s is reduced and forwarded at
// once, while the next pieces are still on the wire. Receives land in scratch slots (step s in slot
// s % slots), posted `slots` steps ahead: ranks upstream may run several steps ahead of us, and a
// frame whose receive is already posted lands in place instead of in an unexpected-frame copy.
// slots covers as many steps as MCCL_RING_LOOKAHEAD_BYTES of scratch holds, at least 2 (double buffer).
// Compressed pieces land in wire buffers instead (collective.h), posted as many steps ahead.
//
// All-gather schedule: at step s rank r sends segment (r-s) and receives segment (r-s-1) straight
// into its final place (zero-copy); a received piece is forwarded at step s+1 from where it landed.
//
// Wire compression (MCCL_WIRE_DTYPE): pieces travel as bf16/fp16 (MCCL_CHUNK_BYTES of them on the wire).
// The reduce-scatter widens a received piece inside the reduction and narrows the partial sum for the next
// hop in the same pass (tile by tile: each partial sum is rounded once per hop); the all-gather first rounds this rank's own segment
// in place, then forwards each received piece as it came (no second conversion), widening it into place,
// so every rank ends with the same bits.
#include <algorithm>

#include "../reduce.h"
#include "algorithms.h"

namespace mccl {
namespace {

int wrap(int value, int n) { return ((value % n) + n) % n; }

// Pieces of a segment: at least one (an empty frame still tells the peer what we called),
// the last one clamped to the segment's end.
struct Pieces {
  size_t piece;
  size_t count(const Segment& seg) const { return std::max<size_t>(1, (seg.bytes + piece - 1) / piece); }
  size_t begin(const Segment& seg, size_t p) const { return std::min(seg.bytes, p * piece); }
  size_t length(const Segment& seg, size_t p) const { return std::min(seg.bytes, (p + 1) * piece) - begin(seg, p); }
};

}  // namespace

std::vector<Segment> even_segments(char* data, size_t count, size_t element_size, int parts) {
  std::vector<Segment> segs(parts);
  size_t base = count / parts, extra = count % parts, offset = 0;
  for (int k = 0; k < parts; ++k) {
    size_t elements = base + (static_cast<size_t>(k) < extra ? 1 : 0);
    segs[k] = {data + offset, elements * element_size, offset};
    offset += elements * element_size;
  }
  return segs;
}

void ring_reduce_scatter(Collective& c, const std::vector<Segment>& segs, uint32_t step_base) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  const int right = wrap(r + 1, n), left = wrap(r - 1, n), steps = n - 1;
  const size_t esize = dtype_size(c.dtype());
  const Pieces pieces{c.piece_bytes(esize)};
  size_t max_seg = 0;
  for (const auto& seg : segs) max_seg = std::max(max_seg, seg.bytes);
  const size_t fit = c.config().ring_lookahead_bytes / std::max<size_t>(max_seg, 1);
  const int slots = static_cast<int>(std::min<size_t>(steps, std::max<size_t>(2, fit)));
  // Compressed, recv_for_reduce receives into wire buffers: no scratch (it is zero-filled when it grows, up
  // to MCCL_RING_LOOKAHEAD_BYTES, for nothing), and no landing.
  char* scratch = c.compressed() ? nullptr : c.scratch(0, static_cast<size_t>(slots) * max_seg);

  auto send_seg = [&](int s) -> const Segment& { return segs[wrap(r - s - 1, n)]; };
  auto recv_seg = [&](int s) -> const Segment& { return segs[wrap(r - s - 2, n)]; };
  std::vector<std::vector<RequestPtr>> recvs(steps);
  std::vector<RequestPtr> sends;
  auto post_recvs = [&](int s) {
    const Segment& seg = recv_seg(s);
    for (size_t p = 0; p < pieces.count(seg); ++p) {
      size_t at = pieces.begin(seg, p);
      char* landing = scratch ? scratch + (s % slots) * max_seg + at : nullptr;
      recvs[s].push_back(c.recv_for_reduce(left, landing, pieces.length(seg, p), seg.offset + at, step_base + s));
    }
  };

  for (int s = 0; s < slots; ++s) post_recvs(s);
  for (size_t p = 0; p < pieces.count(send_seg(0)); ++p) {
    const Segment& seg = send_seg(0);
    size_t at = pieces.begin(seg, p);
    sends.push_back(c.send(right, seg.data + at, pieces.length(seg, p), seg.offset + at, step_base));
  }
  for (int s = 0; s < steps; ++s) {
    const Segment& seg = recv_seg(s);
    for (size_t p = 0; p < pieces.count(seg); ++p) {
      size_t at = pieces.begin(seg, p), len = pieces.length(seg, p);
      c.wait(recvs[s][p]);
      char* narrowed = s + 1 < steps ? c.wire_buffer(len) : nullptr;  // compressed: narrowed in the same pass
      c.reduce_received(seg.data + at, recvs[s][p], len, narrowed);
      if (s + 1 < steps)
        sends.push_back(c.send_narrowed(right, seg.data + at, narrowed, len, seg.offset + at, step_base + s + 1));
    }
    if (s + slots < steps) post_recvs(s + slots);
  }
  c.wait_all(sends);
}

void ring_allgather(Collective& c, const std::vector<Segment>& segs, uint32_t step_base) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  const int right = wrap(r + 1, n), left = wrap(r - 1, n), steps = n - 1;
  const Pieces pieces{c.piece_bytes(dtype_size(c.dtype()))};

  std::vector<std::vector<RequestPtr>> recvs(steps);
  std::vector<RequestPtr> sends;
  for (int s = 0; s < steps; ++s) {
    const Segment& seg = segs[wrap(r - s - 1, n)];
    for (size_t p = 0; p < pieces.count(seg); ++p) {
      size_t at = pieces.begin(seg, p);
      recvs[s].push_back(c.recv_to_forward(left, seg.data + at, pieces.length(seg, p), seg.offset + at,
                                           step_base + s));
    }
  }
  const Segment& own = segs[r];
  c.round_to_wire(own.data, own.bytes);  // this rank keeps what the others receive
  for (size_t p = 0; p < pieces.count(own); ++p) {
    size_t at = pieces.begin(own, p);
    sends.push_back(c.send(right, own.data + at, pieces.length(own, p), own.offset + at, step_base));
  }
  for (int s = 0; s < steps; ++s) {
    const Segment& seg = segs[wrap(r - s - 1, n)];
    for (size_t p = 0; p < pieces.count(seg); ++p) {
      c.wait(recvs[s][p]);
      size_t at = pieces.begin(seg, p);
      if (s + 1 < steps) sends.push_back(c.forward(right, recvs[s][p], seg.offset + at, step_base + s + 1));
    }
  }
  c.wait_all(sends);
}

}  // namespace mccl
