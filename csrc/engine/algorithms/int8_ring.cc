// The 8-bit allreduce's ring (docs/int8.md, *The algorithms*): the encoded buffer reduce-scattered, then all-gathered,
// around the ring, each partial sum added in float32 and requantised at every hop.
//
// The buffer, its segments and its pieces are the exchange's (EncodedSegments: segment k, whole blocks, is rank
// k's to finish). Each rank sends only to rank r+1 and receives only from rank r-1: one flow in and one out,
// where the exchange has every rank send to and receive from all others at once; the bytes are the same,
// (n-1)/n of the buffer twice.
//
// Reduce-scatter, steps s = 0 .. n-2, piece by piece. Step 0: rank r sends its own contribution to segment r-1,
// as it is in the buffer (EncodedSegments::contribution: encoded there first from float32 values). Step s: it receives the partial sum of segment r-s-2 from rank r-1, decodes its own
// contribution to that piece, adds the two in float32 and encodes the sum (a requantisation: the 8-bit blocks of
// int8_blocks.h, scales from the sum's own blocks) in the same pass, then sends it on as step s+1. So segment k
// collects its contributions in the order k+1, k+2, ..., k-1, and its owner k adds its own last: in the last step
// the sum is final, divided for AVG, encoded once more into the buffer, with the error of that encoding added to
// the owned error feedback, and sent on at once as the all-gather's step 0.
// All-gather, header steps n-1 .. 2n-3: rank r receives the finished segment r-t-1 into its buffer as it comes
// and forwards it unchanged, so every rank ends with the owner's bytes, the same on every rank. A finished piece
// lands where this rank's contribution to it was read from; the owner finishes it only after that contribution
// has gone round, so the memory is free by then.
//
// Error. Take one value's block. Rank m's contribution is encoded once (error at most c A_m, c = (1 + 2^-16) / 252,
// A_m the largest finite magnitude of rank m's values in the block), as in the exchange. The j-th partial sum along
// the ring (j = 1 .. n-1: j+1 contributions; the (n-1)-th is the sum) is encoded once, by the rank that made it,
// with error at most c M_j, M_j its largest magnitude in the block. So, in the units of the sum,
//   |result - exact sum| <= c (sum over m of A_m  +  M_1 + ... + M_{n-1})  + float32's rounding of the n-1 sums,
// where M_j <= A of its j+1 contributors summed, plus the errors of the encodings before it. The exchange's bound is the
// same without M_1 .. M_{n-2}: c (sum of A_m + M_{n-1}). With n ranks of like magnitudes A, the ring's is at most
// (n^2 + 3n - 2) / 2 c A, the exchange's 2n c A: the hops' part grows with n, and with it the error; partial sums of
// values of random sign grow like sqrt(j), so in practice it grows more slowly (docs/int8.md measures it).
//
// Error feedback: the caller's residual covers this rank's first encoding of its values (the caller's, or
// allreduce_int8_values'), and owned_error the last, of the sums this rank finishes; the n-2 requantisations in
// between are the ring's own, made on partial sums no caller holds, and are not fed back.
//
// Receives are posted in the order frames come from rank r-1 (its reduce-scatter steps, then its all-gather),
// the reduce-scatter's `slots` steps ahead (as many as MCCL_RING_LOOKAHEAD_BYTES holds of wire buffers, at least
// two), the all-gather's, straight into the buffer, at the start of the last reduce-scatter step.
#include <algorithm>

#include "algorithms.h"

namespace mccl {
namespace {

class Int8Ring {
 public:
  Int8Ring(Collective& c, const EncodedSegments& at, float* owned_error)
      : c_(c), n_(c.size()), r_(c.rank()), steps_(n_ - 1), at_(at), owned_error_(owned_error),
        reductions_(steps_), gathered_(steps_) {
    size_t largest = 0;
    for (const Segment& seg : at_.segs) largest = std::max(largest, seg.bytes);
    const size_t wire = std::max<size_t>(int8_wire_bytes(largest / sizeof(float)), 1);
    const size_t fit = c.config().ring_lookahead_bytes / wire;
    slots_ = static_cast<int>(std::min<size_t>(steps_, std::max<size_t>(2, fit)));
  }

  void run() {
    for (int s = 0; s < slots_; ++s) expect_partials(s);
    const int first = segment(-1);
    for (size_t p = 0; p < at_.pieces_of(first); ++p)
      sends_.push_back(
          c_.send_encoded(right(), at_.contribution(first, p), at_.values(first, p), at_.offset(first, p), 0));
    for (int s = 0; s < steps_; ++s) {
      if (s + 1 == steps_) expect_finished();
      const int k = segment(-s - 2);
      for (size_t p = 0; p < at_.pieces_of(k); ++p) add_own(s, k, p);
      if (s + slots_ < steps_) expect_partials(s + slots_);
    }
    for (int t = 0; t < steps_; ++t) {
      const int k = segment(-t - 1);
      for (size_t p = 0; p < at_.pieces_of(k); ++p) {
        c_.wait(gathered_[t][p]);
        if (t + 1 < steps_)
          sends_.push_back(c_.send_encoded(right(), at_.encoded(k, p), at_.values(k, p), at_.offset(k, p),
                                           static_cast<uint32_t>(steps_ + t + 1)));
      }
    }
    c_.wait_all(sends_);
  }

 private:
  int segment(int delta) const { return ((r_ + delta) % n_ + n_) % n_; }  // of rank r + delta
  int right() const { return segment(1); }
  int left() const { return segment(-1); }

  // The partial sums of reduce-scatter step s: segment r-s-2, piece by piece.
  void expect_partials(int s) {
    const int k = segment(-s - 2);
    for (size_t p = 0; p < at_.pieces_of(k); ++p)
      reductions_[s].push_back(
          c_.recv_to_reduce(left(), at_.bytes(k, p), at_.offset(k, p), static_cast<uint32_t>(s)));
  }

  // Every finished piece, all-gather step t being segment r-t-1's, into the buffer.
  void expect_finished() {
    for (int t = 0; t < steps_; ++t) {
      const int k = segment(-t - 1);
      for (size_t p = 0; p < at_.pieces_of(k); ++p)
        gathered_[t].push_back(c_.recv_encoded(left(), at_.encoded(k, p), at_.values(k, p), at_.offset(k, p),
                                               static_cast<uint32_t>(steps_ + t)));
    }
  }

  // Piece p of segment k at step s: this rank's contribution decoded, the partial sum that came added to it, the
  // result requantised and sent on; in the last step (k = r) finished into the buffer instead.
  void add_own(int s, int k, size_t p) {
    const size_t len = at_.bytes(k, p);
    float* sum = reinterpret_cast<float*>(c_.scratch(1, len));
    c_.decode(sum, at_.contribution(k, p), at_.values(k, p));  // while the partial sum may still be arriving
    const RequestPtr& partial = reductions_[s][p];
    c_.wait(partial);
    if (s + 1 < steps_) {
      const Onward next{right(), at_.offset(k, p), static_cast<uint32_t>(s + 1)};
      sends_.push_back(c_.reduce_and_send(sum, partial, len, next));
      return;
    }
    float* error = owned_error_ ? owned_error_ + at_.first_in_segment(k, p) : nullptr;
    const std::vector<Onward> next = {{right(), at_.offset(k, p), static_cast<uint32_t>(steps_)}};
    c_.reduce_final_into(sum, partial, len, at_.encoded(k, p), error, next, &sends_);
  }

  Collective& c_;
  const int n_, r_, steps_;
  const EncodedSegments& at_;
  float* const owned_error_;
  int slots_ = 2;  // reduce-scatter steps whose receives are posted ahead
  std::vector<std::vector<RequestPtr>> reductions_, gathered_;  // per step, one per piece
  std::vector<RequestPtr> sends_;
};

}  // namespace

void allreduce_int8_ring(Collective& c, const EncodedSegments& at, float* owned_error) {
  Int8Ring(c, at, owned_error).run();
}

}  // namespace mccl
