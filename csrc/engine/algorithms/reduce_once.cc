// The 8-bit allreduce's exchange (docs/int8.md): encoded values sent straight to their owner, each segment
// reduced once, there.
//
// Its buffer holds this rank's values encoded (int8_blocks.h), its contribution, and ends holding the encoded
// result. The blocks are split into n segments (int8_segment: whole blocks), rank k owning segment k, and every
// segment into pieces of whole blocks, about MCCL_CHUNK_BYTES on the wire. Each rank sends piece p of every other
// segment straight to its owner, as it is; the owner decodes its own values of the piece and the n-1
// contributions, adds them in float32 in a fixed order (its own, then peers r+1, r+2, ...: the result does not
// depend on arrival times), divides for AVG, encodes the sum once, into its buffer, and sends that straight to
// every other rank, which receives it into its buffer as it is. So every value is encoded once by each
// contributor and once by its owner, whatever n: the error of the 8-bit format does not grow with the number of
// hops, as it does in the ring (int8_ring.cc), where each partial sum is encoded again at every hop. Each rank
// sends (n-1)/n of the buffer twice, as in the ring, but to all n-1 peers at once. The finished piece lands where
// this rank's contribution to it was sent from: the owner finishes it only once that contribution has arrived
// whole, so the send has left that memory.
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
  ReduceOnce(Collective& c, const EncodedSegments& at, float* owned_error)
      : c_(c), n_(c.size()), r_(c.rank()), at_(at), owned_error_(owned_error) {
    contributions_.resize(at_.pieces_of(r_));
    for (int k = 0; k < n_; ++k) rounds_ = std::max(rounds_, at_.pieces_of(k));
    const size_t round_bytes = at_.pieces.piece * static_cast<size_t>(n_ - 1) * 2;
    window_ = std::max<size_t>(1, c.config().ring_lookahead_bytes / std::max<size_t>(round_bytes, 1));
  }

  void run() {
    for (size_t p = 0; p < kRoundsAhead; ++p) expect_contributions(p);
    for (size_t p = 0; p < std::min(window_, rounds_); ++p) expect_round(p);
    for (size_t p = 0; p < kRoundsAhead; ++p) contribute(p);
    for (size_t p = 0; p < rounds_; ++p) {
      if (p + window_ < rounds_) expect_round(p + window_);
      contribute(p + kRoundsAhead);
      if (p < at_.pieces_of(r_)) finish(p);
    }
    c_.wait_all(finished_elsewhere_);
    c_.wait_all(sends_);
  }

 private:
  int peer(int i) const { return (r_ + i) % n_; }  // i = 1 .. n-1

  // This rank's contributions to piece p of every other segment.
  void contribute(size_t p) {
    for (int i = 1; i < n_; ++i) {
      const int k = peer(i);
      if (p >= at_.pieces_of(k)) continue;
      sends_.push_back(c_.send_encoded(k, at_.contribution(k, p), at_.values(k, p), at_.offset(k, p), kContribution));
    }
  }

  // The receives of round p after the first kRoundsAhead: contributions of round p + kRoundsAhead, then
  // every peer's finished piece p, as the peers send them.
  void expect_round(size_t p) {
    expect_contributions(p + kRoundsAhead);
    for (int i = 1; i < n_; ++i) {
      const int k = peer(i);
      if (p >= at_.pieces_of(k)) continue;
      finished_elsewhere_.push_back(
          c_.recv_encoded(k, at_.encoded(k, p), at_.values(k, p), at_.offset(k, p), kFinished));
    }
  }

  void expect_contributions(size_t p) {
    if (p >= at_.pieces_of(r_)) return;
    for (int i = 1; i < n_; ++i)
      contributions_[p].push_back(c_.recv_to_reduce(peer(i), at_.bytes(r_, p), at_.offset(r_, p), kContribution));
  }

  // Piece p of this rank's own segment: its own values, then every contribution added in peer order, the last
  // one finishing it into the buffer.
  void finish(size_t p) {
    const size_t len = at_.bytes(r_, p);
    float* sum = reinterpret_cast<float*>(c_.scratch(1, len));
    c_.decode(sum, at_.contribution(r_, p), at_.values(r_, p));
    std::vector<RequestPtr>& received = contributions_[p];
    for (size_t k = 0; k + 1 < received.size(); ++k) {
      c_.wait(received[k]);
      c_.reduce_received(sum, received[k], len);
    }
    std::vector<Onward> everyone;
    for (int i = 1; i < n_; ++i) everyone.push_back({peer(i), at_.offset(r_, p), kFinished});
    float* error = owned_error_ ? owned_error_ + at_.first_in_segment(r_, p) : nullptr;
    c_.wait(received.back());
    c_.reduce_final_into(sum, received.back(), len, at_.encoded(r_, p), error, everyone, &sends_);
  }

  Collective& c_;
  const int n_, r_;
  const EncodedSegments& at_;
  float* const owned_error_;
  size_t rounds_ = 0;  // pieces in the longest segment
  size_t window_ = 1;  // rounds of receives posted ahead
  std::vector<std::vector<RequestPtr>> contributions_;  // per own piece, one per peer in peer order
  std::vector<RequestPtr> finished_elsewhere_, sends_;
};

}  // namespace

void allreduce_int8_exchange(Collective& c, const EncodedSegments& at, float* owned_error) {
  ReduceOnce(c, at, owned_error).run();
}

}  // namespace mccl
