// The collective algorithms. Each runs on the progress thread inside one Collective and returns when
// this rank's part is complete (or throws). Buffers are raw bytes; counts are elements of c.dtype().
#pragma once

#include <algorithm>
#include <vector>

#include "../collective.h"
#include "../int8_blocks.h"

namespace mccl {

// --- ring.cc: the bandwidth-optimal building blocks -------------------------------------------
// On return segs[rank] holds the reduction over all ranks of their segs[rank]. Other segments are
// left with partial sums.
void ring_reduce_scatter(Collective& c, const std::vector<Segment>& segs, uint32_t step_base);
// On entry segs[rank] holds this rank's part; on return every segs[k] holds rank k's part.
void ring_allgather(Collective& c, const std::vector<Segment>& segs, uint32_t step_base);
// The two in one (steps 0..n-2, then n-1..2n-3): on return every segs[k] holds the reduction of all
// ranks' segs[k] (divided by size() for AVG).
void ring_allreduce(Collective& c, const std::vector<Segment>& segs);
// Pieces of a segment, the pipelining unit of the ring and the exchange: at least one (an empty frame still
// tells the peer what we called), the last one clamped to the segment's end.
struct Pieces {
  size_t piece;  // bytes (Collective::piece_bytes)
  size_t count(const Segment& seg) const { return std::max<size_t>(1, (seg.bytes + piece - 1) / piece); }
  size_t begin(const Segment& seg, size_t p) const { return std::min(seg.bytes, p * piece); }
  size_t length(const Segment& seg, size_t p) const { return std::min(seg.bytes, (p + 1) * piece) - begin(seg, p); }
};
// Splits `bytes` into size() segments of whole elements, as evenly as possible (the first ones get
// one more element), with logical offsets starting at 0.
std::vector<Segment> even_segments(char* data, size_t count, size_t element_size, int parts);

// --- allreduce.cc -------------------------------------------------------------------------------
// The entry points (allreduce, broadcast, reduce, allgather, reduce_scatter) pick their algorithm
// with select.h; the variants after them run one algorithm whatever the size.
void allreduce(Collective& c, void* buf, size_t count);
void allreduce_ring(Collective& c, void* buf, size_t count);
void allreduce_recursive_doubling(Collective& c, void* buf, size_t count);
// --- The 8-bit allreduce (docs/int8.md) ----------------------------------------------------------
// int8_allreduce.cc: the entry points, which pick the algorithm (select.h). `blocks`: int8_wire_bytes(count)
// bytes, this rank's values encoded (int8_blocks.h); on return the encoded result, the same bytes on every rank.
// `owned_error`: null, or error feedback for the values this rank owns (int8_segment(count, rank, size)), one
// float each: the error of the encoding of their sum, which this rank makes, is added to it.
void allreduce_int8_blocks(Collective& c, char* blocks, size_t count, float* owned_error);
// The same on float32 values: encoded with `residual` (null, or `count` floats: Codec::encode's error feedback),
// the collective (its owned part the owned_error), decoded into `buf`. One rank: untouched.
void allreduce_int8_values(Collective& c, float* buf, size_t count, float* residual);
// The encoded buffer as both algorithms cut it: size() segments of whole blocks (int8_segment), rank k owning
// segment k, each in pieces of whole blocks (Pieces: about MCCL_CHUNK_BYTES on the wire). Sizes and offsets count
// float32 bytes, as frame headers do; encoded() is where a piece's wire form starts in the buffer.
struct EncodedSegments {
  // `source` (with `residual`: null, or one float per value, Codec::encode's error feedback): the caller's
  // float32 values, each piece encoded into the buffer when an algorithm first asks for this rank's contribution
  // to it, so that encoding overlaps the traffic (the same bytes as encoding them whole: pieces are whole blocks).
  // Null: the buffer holds them encoded already.
  EncodedSegments(Collective& c, char* blocks, size_t count, const float* source = nullptr, float* residual = nullptr);
  size_t pieces_of(int k) const { return pieces.count(segs[k]); }
  size_t bytes(int k, size_t p) const { return pieces.length(segs[k], p); }
  size_t values(int k, size_t p) const { return bytes(k, p) / sizeof(float); }
  uint64_t offset(int k, size_t p) const { return segs[k].offset + pieces.begin(segs[k], p); }
  size_t first_in_segment(int k, size_t p) const { return pieces.begin(segs[k], p) / sizeof(float); }
  char* encoded(int k, size_t p) const { return blocks + int8_wire_bytes(offset(k, p) / sizeof(float)); }
  // This rank's contribution to piece p of segment k, in wire form, at encoded(k, p); asked for once a piece.
  char* contribution(int k, size_t p) const;

  Collective& c;
  char* const blocks;
  const float* const source;
  float* const residual;
  const Pieces pieces;
  std::vector<Segment> segs;  // float32 byte ranges of the values, no data
};
// The two algorithms, on two ranks or more; `owned_error` as above. reduce_once.cc: every segment reduced once, at
// its owner, from contributions every rank sends straight to it (the exchange). int8_ring.cc: the ring, each
// partial sum requantised at every hop.
void allreduce_int8_exchange(Collective& c, const EncodedSegments& at, float* owned_error);
void allreduce_int8_ring(Collective& c, const EncodedSegments& at, float* owned_error);

// --- rooted.cc: one rank is the source or the destination ---------------------------------------
void broadcast(Collective& c, void* buf, size_t count, int root);
void reduce(Collective& c, void* buf, size_t count, int root);
// outs (root only) holds size() pointers of `bytes` each.
void gather(Collective& c, const void* in, size_t bytes, const std::vector<char*>& outs, int root);
void scatter(Collective& c, const std::vector<const char*>& ins, void* out, size_t bytes, int root);

// --- exchange.cc: everyone to everyone --------------------------------------------------------
// outs holds size() pointers of `count` elements each; in is this rank's `count` elements.
void allgather(Collective& c, const void* in, size_t count, const std::vector<char*>& outs);
void allgather_ring(Collective& c, const void* in, size_t count, const std::vector<char*>& outs);
void allgather_bruck(Collective& c, const void* in, size_t count, const std::vector<char*>& outs);
// in holds size() * count elements (rank k's block at k*count); out receives this rank's block.
void reduce_scatter(Collective& c, const void* in, size_t count, void* out);
void reduce_scatter_ring(Collective& c, const void* in, size_t count, void* out);
void reduce_scatter_recursive_doubling(Collective& c, const void* in, size_t count, void* out);
// send_counts/recv_counts in elements, one per rank; blocks are packed in rank order.
void alltoall(Collective& c, const void* in, const std::vector<size_t>& send_counts, void* out,
              const std::vector<size_t>& recv_counts);
void barrier(Collective& c);

}  // namespace mccl
