// Allreduce by direct exchange, reduced once: the 8-bit allreduce's algorithm (docs/int8.md).
//
// The buffer is split into n segments, rank k owning segment k, and every segment into pieces of
// MCCL_CHUNK_BYTES on the wire. Each rank sends piece p of every other segment straight to its owner (its
// contribution, encoded once); the owner adds the n-1 contributions to its own values in float32, in a fixed
// order (so the result does not depend on arrival times), and sends the finished piece, encoded once, straight
// to every other rank, which decodes it into place. So every value is encoded once by each contributor and
// once by its owner, whatever n: the error of an 8-bit format does not grow with the number of hops, as it
// does in the ring, where each partial sum is encoded again at every hop. Each rank sends (n-1)/n of the
// buffer twice, as in the ring.
//
// Pieces pipeline in rounds. Round p: a rank sends its contributions to piece p of every segment, to peers
// r+1, r+2, ... (so that ranks send to different peers at any moment), and finishes piece p of its own
// segment as soon as its contributions are in. Contributions run kRoundsAhead rounds ahead of the finished
// pieces, so the frames a rank sends to one peer come in a fixed order: rounds 0..kRoundsAhead-1 of
// contributions, then, round by round, the contributions of round p + kRoundsAhead and the finished piece p.
// Receives are posted in that same order (frames from one peer match receives in posting order), `window`
// rounds ahead, as many as MCCL_RING_LOOKAHEAD_BYTES holds.
#include <algorithm>

#include "algorithms.h"

namespace mccl {
namespace {

constexpr size_t kRoundsAhead = 2;  // rounds of contributions sent before the first own piece is finished
constexpr uint32_t kContribution = 0, kFinished = 1;  // header steps of the two kinds of frames

class ReduceOnce {
 public:
  ReduceOnce(Collective& c, void* buf, size_t count)
      : c_(c), n_(c.size()), r_(c.rank()),
        segs_(even_segments(static_cast<char*>(buf), count, dtype_size(c.dtype()), n_)),
        pieces_{c.piece_bytes()}, own_(segs_[r_]), contributions_(pieces_.count(own_)) {
    for (const Segment& seg : segs_) rounds_ = std::max(rounds_, pieces_.count(seg));
    const size_t round_bytes = pieces_.piece * static_cast<size_t>(n_ - 1) * 2;
    window_ = std::max<size_t>(1, c.config().ring_lookahead_bytes / std::max<size_t>(round_bytes, 1));
  }

  void run() {
    for (size_t p = 0; p < kRoundsAhead; ++p) expect_contributions(p);
    for (size_t p = 0; p < std::min(window_, rounds_); ++p) expect_round(p);
    for (size_t p = 0; p < kRoundsAhead; ++p) contribute(p);
    for (size_t p = 0; p < rounds_; ++p) {
      if (p + window_ < rounds_) expect_round(p + window_);
      contribute(p + kRoundsAhead);
      if (p < pieces_.count(own_)) finish(p);
    }
    c_.wait_all(finished_elsewhere_);
    c_.wait_all(sends_);
  }

 private:
  int peer(int i) const { return (r_ + i) % n_; }  // i = 1 .. n-1

  // This rank's contributions to piece p of every other segment.
  void contribute(size_t p) {
    for (int i = 1; i < n_; ++i) {
      const Segment& seg = segs_[peer(i)];
      if (p >= pieces_.count(seg)) continue;
      const size_t at = pieces_.begin(seg, p);
      sends_.push_back(c_.send(peer(i), seg.data + at, pieces_.length(seg, p), seg.offset + at, kContribution));
    }
  }

  // The receives of round p after the first kRoundsAhead: contributions of round p + kRoundsAhead, then
  // every peer's finished piece p, as the peers send them.
  void expect_round(size_t p) {
    expect_contributions(p + kRoundsAhead);
    for (int i = 1; i < n_; ++i) {
      const Segment& seg = segs_[peer(i)];
      if (p >= pieces_.count(seg)) continue;
      const size_t at = pieces_.begin(seg, p);
      finished_elsewhere_.push_back(
          c_.recv(peer(i), seg.data + at, pieces_.length(seg, p), seg.offset + at, kFinished));
    }
  }

  void expect_contributions(size_t p) {
    if (p >= pieces_.count(own_)) return;
    const size_t at = pieces_.begin(own_, p), len = pieces_.length(own_, p);
    for (int i = 1; i < n_; ++i)
      contributions_[p].push_back(c_.recv_to_reduce(peer(i), len, own_.offset + at, kContribution));
  }

  // Piece p of this rank's own segment: every contribution added, in peer order, the last one finishing it.
  void finish(size_t p) {
    const size_t at = pieces_.begin(own_, p), len = pieces_.length(own_, p);
    std::vector<RequestPtr>& received = contributions_[p];
    for (size_t k = 0; k + 1 < received.size(); ++k) {
      c_.wait(received[k]);
      c_.reduce_received(own_.data + at, received[k], len);
    }
    std::vector<Onward> everyone;
    for (int i = 1; i < n_; ++i) everyone.push_back({peer(i), own_.offset + at, kFinished});
    c_.wait(received.back());
    c_.reduce_final_and_send(own_.data + at, received.back(), len, everyone, &sends_);
  }

  Collective& c_;
  const int n_, r_;
  const std::vector<Segment> segs_;
  const Pieces pieces_;
  const Segment& own_;
  size_t rounds_ = 0;  // pieces in the longest segment
  size_t window_ = 1;  // rounds of receives posted ahead
  std::vector<std::vector<RequestPtr>> contributions_;  // per own piece, one per peer in peer order
  std::vector<RequestPtr> finished_elsewhere_, sends_;
};

}  // namespace

void allreduce_reduce_once(Collective& c, void* buf, size_t count) {
  if (c.size() > 1) ReduceOnce(c, buf, count).run();
}

}  // namespace mccl
