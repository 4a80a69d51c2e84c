// Ring reduce-scatter and all-gather, pipelined in pieces of MCCL_CHUNK_BYTES.
//
// Ranks form a ring: each sends only to its right neighbour (rank+1) and receives only from its
// left (rank-1), so every link carries the same load and the total traffic per rank is
// 2(n-1)/n of the buffer for an allreduce: bandwidth-optimal.
//
// Reduce-scatter schedule, n ranks, buffer in n segments: at step s (0 <= s < n-1) rank r sends
// segment (r-s-1) and receives segment (r-s-2), which it reduces into its own copy. What it receives
// at step s is what it sends at step s+1, so after n-1 steps segment r holds everyone's
// contribution. Each segment moves as pieces: a piece received at step s is reduced and sent on at
// once (in the same pass over it), while the next pieces are still on the wire. Receives are posted
// `slots` steps ahead: ranks upstream may run several steps ahead of us, and a frame whose receive is
// already posted lands in a buffer of its own instead of in an unexpected-frame copy. slots covers as
// many steps as MCCL_RING_LOOKAHEAD_BYTES holds, at least 2 (double buffer).
//
// All-gather schedule: at step s rank r sends segment (r-s) and receives segment (r-s-1) straight
// into its final place; a received piece is forwarded at step s+1 as it came.
//
// Allreduce: the reduce-scatter, then the all-gather, with no seam between them. In the reduce-scatter's
// last step rank r receives the last contribution to its own segment, piece by piece, and each piece is
// final once reduced: it is divided (AVG) and sent on as the all-gather's step 0 at once, while the next
// pieces are still arriving. The all-gather's receives are posted just before that step.
//
// The ring never sees the wire format (codec.h): a piece travels in the collective's format, a partial sum
// is encoded for the next hop in the pass that reduces it, and data a rank keeps and sends is left holding
// what the others receive, so every rank ends with the same bits.
#include <algorithm>

#include "algorithms.h"

namespace mccl {
namespace {

int wrap(int value, int n) { return ((value % n) + n) % n; }

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

namespace {

// The all-gather's half of the ring, in three parts, so that an allreduce can start it inside its
// reduce-scatter: post every receive, send this rank's own segment piece by piece (each one final), then
// forward what arrives.
class Allgather {
 public:
  Allgather(Collective& c, const std::vector<Segment>& segs, uint32_t step_base)
      : c_(c), segs_(segs), step_base_(step_base), n_(c.size()), r_(c.rank()), right_(wrap(r_ + 1, n_)),
        left_(wrap(r_ - 1, n_)), steps_(n_ - 1), pieces_{c.piece_bytes()}, recvs_(steps_) {}

  const Segment& own() const { return segs_[r_]; }
  const Pieces& pieces() const { return pieces_; }

  // Every receive, straight into its final place, kept to forward.
  void post_recvs() {
    for (int s = 0; s < steps_; ++s) {
      const Segment& seg = arriving(s);
      for (size_t p = 0; p < pieces_.count(seg); ++p) {
        size_t at = pieces_.begin(seg, p);
        recvs_[s].push_back(
            c_.recv_to_forward(left_, seg.data + at, pieces_.length(seg, p), seg.offset + at, step_base_ + s));
      }
    }
  }

  // Where piece p of this rank's own segment goes.
  Onward own_frame(size_t p) const { return {right_, own().offset + pieces_.begin(own(), p), step_base_}; }
  // Piece p of this rank's own segment, which holds its final value.
  void send_own(size_t p) {
    const size_t at = pieces_.begin(own(), p);
    sends_.push_back(c_.send(right_, own().data + at, pieces_.length(own(), p), own().offset + at, step_base_));
  }
  // The send of an own piece that the reduce-scatter posted.
  void sent_own(RequestPtr send) { sends_.push_back(std::move(send)); }

  // Each piece is forwarded as it came.
  void finish() {
    for (int s = 0; s < steps_; ++s) {
      const Segment& seg = arriving(s);
      for (size_t p = 0; p < pieces_.count(seg); ++p) {
        const size_t at = pieces_.begin(seg, p);
        c_.wait(recvs_[s][p]);
        if (s + 1 < steps_) sends_.push_back(c_.forward(right_, recvs_[s][p], seg.offset + at, step_base_ + s + 1));
      }
    }
    c_.wait_all(sends_);
  }

 private:
  const Segment& arriving(int s) const { return segs_[wrap(r_ - s - 1, n_)]; }

  Collective& c_;
  const std::vector<Segment>& segs_;
  const uint32_t step_base_;
  const int n_, r_, right_, left_, steps_;
  const Pieces pieces_;
  std::vector<std::vector<RequestPtr>> recvs_;
  std::vector<RequestPtr> sends_;
};

// The reduce-scatter's schedule (top of this file). With `then`, this rank's own segment is final piece by
// piece in the last step, and each piece goes on at once as the all-gather's first (`then` has posted its
// receives by then, after every receive of this one, so that frames meet receives in the order they come).
// Segments whose values are elsewhere (Segment::own) are read from there by the step that first needs them,
// so nothing is copied before the first piece is on the wire (`then` needs the values in place).
void reduce_scatter_pipelined(Collective& c, const std::vector<Segment>& segs, uint32_t step_base, Allgather* then) {
  const int n = c.size(), r = c.rank();
  const int right = wrap(r + 1, n), left = wrap(r - 1, n), steps = n - 1;
  const Pieces pieces{c.piece_bytes()};
  size_t max_seg = 0;
  for (const auto& seg : segs) max_seg = std::max(max_seg, seg.bytes);
  const size_t fit = c.config().ring_lookahead_bytes / std::max<size_t>(max_seg, 1);
  const int slots = static_cast<int>(std::min<size_t>(steps, std::max<size_t>(2, fit)));

  auto send_seg = [&](int s) -> const Segment& { return segs[wrap(r - s - 1, n)]; };
  auto recv_seg = [&](int s) -> const Segment& { return segs[wrap(r - s - 2, n)]; };
  std::vector<std::vector<RequestPtr>> recvs(steps);
  std::vector<RequestPtr> sends;
  auto post_recvs = [&](int s) {
    const Segment& seg = recv_seg(s);
    for (size_t p = 0; p < pieces.count(seg); ++p) {
      size_t at = pieces.begin(seg, p);
      recvs[s].push_back(c.recv_to_reduce(left, pieces.length(seg, p), seg.offset + at, step_base + s));
    }
  };

  for (int s = 0; s < slots; ++s) post_recvs(s);
  for (size_t p = 0; p < pieces.count(send_seg(0)); ++p) {
    const Segment& seg = send_seg(0);
    size_t at = pieces.begin(seg, p);
    sends.push_back(c.send(right, seg.values() + at, pieces.length(seg, p), seg.offset + at, step_base));
  }
  for (int s = 0; s < steps; ++s) {
    const bool last = s + 1 == steps;
    if (last && then) then->post_recvs();
    const Segment& seg = recv_seg(s);
    for (size_t p = 0; p < pieces.count(seg); ++p) {
      const size_t at = pieces.begin(seg, p), len = pieces.length(seg, p);
      const char* own = seg.own ? seg.own + at : nullptr;  // each segment is reduced into once: here
      c.wait(recvs[s][p]);
      if (!last)
        sends.push_back(c.reduce_and_send(seg.data + at, recvs[s][p], len, {right, seg.offset + at, step_base + s + 1},
                                          own));
      else if (then)
        then->sent_own(c.reduce_final_and_send(seg.data + at, recvs[s][p], len, then->own_frame(p)));
      else
        c.reduce_received(seg.data + at, recvs[s][p], len, own);
    }
    if (s + slots < steps) post_recvs(s + slots);
  }
  c.wait_all(sends);
}

}  // namespace

void ring_reduce_scatter(Collective& c, const std::vector<Segment>& segs, uint32_t step_base) {
  if (c.size() > 1) reduce_scatter_pipelined(c, segs, step_base, nullptr);
}

void ring_allgather(Collective& c, const std::vector<Segment>& segs, uint32_t step_base) {
  if (c.size() == 1) return;
  Allgather gather(c, segs, step_base);
  gather.post_recvs();
  c.keep_as_sent(gather.own().data, gather.own().bytes);  // this rank keeps what the others receive
  for (size_t p = 0; p < gather.pieces().count(gather.own()); ++p) gather.send_own(p);
  gather.finish();
}

// The all-gather starts inside the reduce-scatter: the last step's pieces go on as soon as each is
// reduced (divided for AVG), with no pass over the segment and no drain between the halves.
void ring_allreduce(Collective& c, const std::vector<Segment>& segs) {
  const int n = c.size();
  if (n == 1) return;
  Allgather gather(c, segs, static_cast<uint32_t>(n - 1));
  reduce_scatter_pipelined(c, segs, 0, &gather);
  gather.finish();
}

}  // namespace mccl
