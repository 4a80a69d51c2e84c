// The wire formats of a collective's payloads, one codec each (docs/design.md#wire-formats): what a piece
// looks like on the wire and its size there, how a received piece widens into a reduction, and how data a
// rank keeps is rounded to what the others receive. A collective gets its codec from the wire type in its
// header; the algorithms post sends and receives and ask for reductions through Collective (collective.h),
// which asks the codec, so no algorithm knows which format is in use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "dtype.h"

namespace mccl {

// FrameHeader::wire_dtype. The half types keep DataType's numbers, which is what earlier versions sent.
enum class WireType : uint8_t {
  kExact = 0,       // the payload is the collective's dtype, as it is
  kFloat16 = 3,     // float32 data as IEEE float16 (MCCL_WIRE_DTYPE=fp16)
  kBFloat16 = 4,    // float32 data as bfloat16 (MCCL_WIRE_DTYPE=bf16)
  kInt8Blocks = 16, // float32 data as blocks of 256 int8 codes, each after its float32 scale (int8_blocks.h)
};
bool is_wire_type(uint8_t value);
const char* wire_format_name(WireType type);  // for messages: "uncompressed", "bfloat16", "float16", "int8 blocks"
// The wire type MCCL_WIRE_DTYPE (Config::wire_dtype: kFloat32 for off) gives float32 reductions.
WireType wire_type_of_setting(DataType wire_dtype);
// Payload bytes of `count` elements of `dtype` sent whole in `type`, for the traffic records (timeline.h).
uint64_t wire_bytes_of(WireType type, DataType dtype, uint64_t count);

// What becomes of a piece once a received contribution has been folded into it.
struct Fold {
  char* onward = nullptr;  // the result is also encoded here (wire_bytes of the piece), for the next rank
  const void* own = nullptr;  // this rank's values, when they are not in dst yet: dst = own OP received
  bool final = false;      // the last contribution: divided by the world size for AVG, and, encoded, the piece
                           // is left holding what its receivers will decode
  float* error = nullptr;  // with `onward`: the error of that encoding is added here (one float per element), in
                           // the units of the sum (times the world size after an AVG's division): error feedback
};

// One collective's codec. Counts are elements of the collective's dtype.
class Codec {
 public:
  virtual ~Codec() = default;
  // The codec of a collective of `dtype` and `op` on `world` ranks whose payloads travel as `type` (float32
  // reductions only; anything else is exact). `threads`: how many threads may share a piece's element-wise work
  // (MCCL_REDUCE_THREADS).
  static std::unique_ptr<Codec> make(WireType type, DataType dtype, ReduceOp op, int world, size_t threads);

  // Pieces travel as they are: sends read the caller's memory and receives land where they belong.
  virtual bool in_place() const { return false; }
  virtual size_t wire_bytes(size_t count) const = 0;
  // Elements in a pipelined piece about `chunk_bytes` long on the wire (MCCL_CHUNK_BYTES); at least one.
  virtual size_t piece_elements(size_t chunk_bytes) const = 0;
  // The wire form of this rank's `count` values at `data`. With `error` (narrowing types; null: none), error
  // feedback: what is encoded is data + error, and `error` is then left holding what the receivers lose of it
  // (0 where that is not finite: a NaN or Inf travels as itself and must not come back in the next call).
  virtual void encode(char* wire, const void* data, size_t count, float* error = nullptr) const = 0;
  virtual void decode(void* data, const char* wire, size_t count) const = 0;
  // dst OP= the values `wire` holds; then what `fold` says.
  virtual void reduce(void* dst, const char* wire, size_t count, const Fold& fold) const = 0;
  // data = decode(encode(data)), in place: what a rank keeps of values it also sends. Encoding the result
  // again gives the same wire bytes, so the receivers decode exactly what the sender kept.
  virtual void round(void* data, size_t count) const = 0;
};

}  // namespace mccl
