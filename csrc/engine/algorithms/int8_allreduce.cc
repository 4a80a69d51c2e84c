// The 8-bit allreduce's entry points (docs/int8.md): the algorithm the table picks (select.h: the exchange or
// the ring), on values encoded by the caller or on float32 values.
//
// Float32 values (a CPU tensor's) take the same algorithm as encoded ones: encoded with their error feedback piece
// by piece, as the algorithm first needs each (the same bytes as encoded whole), and decoded whole at the end, so
// the bytes on the wire and the results do not depend on which ranks encoded on a device
// (csrc/torch/int8_codec.cpp) and which here.
#include "algorithms.h"
#include "select.h"

namespace mccl {

EncodedSegments::EncodedSegments(Collective& collective, char* buffer, size_t count, const float* values,
                                 float* error)
    : c(collective), blocks(buffer), source(values), residual(error), pieces{collective.piece_bytes()} {
  for (int k = 0; k < c.size(); ++k) {
    const ValueRange range = int8_segment(count, k, c.size());
    segs.push_back(Segment{nullptr, range.count * sizeof(float), range.first * sizeof(float)});
  }
}

char* EncodedSegments::contribution(int k, size_t p) const {
  char* wire = encoded(k, p);
  if (source) {
    const size_t first = offset(k, p) / sizeof(float);
    c.encode(wire, source + first, values(k, p), residual ? residual + first : nullptr);
  }
  return wire;
}

namespace {

void allreduce_int8_on(Collective& c, const EncodedSegments& at, size_t count, float* owned_error) {
  if (select_int8_algorithm(c.config(), c.size(), count * sizeof(float)) == AlgoChoice::kRing)
    allreduce_int8_ring(c, at, owned_error);
  else
    allreduce_int8_exchange(c, at, owned_error);
}

}  // namespace

void allreduce_int8_blocks(Collective& c, char* blocks, size_t count, float* owned_error) {
  if (c.size() > 1) allreduce_int8_on(c, EncodedSegments(c, blocks, count), count, owned_error);
}

void allreduce_int8_values(Collective& c, float* buf, size_t count, float* residual) {
  if (c.size() == 1) return;  // nothing travels: the values stay exact
  char* blocks = c.scratch(0, int8_wire_bytes(count));
  const ValueRange own = int8_segment(count, c.rank(), c.size());
  allreduce_int8_on(c, EncodedSegments(c, blocks, count, buf, residual), count,
                    residual ? residual + own.first : nullptr);
  c.decode(buf, blocks, count);
}

}  // namespace mccl
