// One collective call in flight: who it is (kind, sequence number, dtype, op, root, count), its
// deadline, and the frames it posts and the reductions it asks for, in the format its codec gives them on the
// wire (codec.h). Algorithms (algorithms/*.cc) only see this.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "codec.h"
#include "config.h"
#include "dtype.h"
#include "transport/transport.h"
#include "wire.h"

namespace mccl {

// A part of a logical buffer: where it lives here, its size, and its byte offset in the logical
// buffer (the offset travels in headers, so both sides agree on what each frame holds).
struct Segment {
  char* data = nullptr;
  size_t bytes = 0;
  uint64_t offset = 0;
  // This rank's own values of the segment, when they are not at `data` (a read-only input the reduce-scatter
  // reads piece by piece, instead of copying it all before it starts): null, they are at `data`.
  const char* own = nullptr;
  const char* values() const { return own ? own : data; }
};

// Buffers for payloads in their wire form (encoded, or received to be reduced), owned by the communicator
// and reused: each one is held by the request that uses it and goes back to the free list once that request
// is done, so the memory in use is what is in flight, not the whole message.
class WireBuffers {
 public:
  // A buffer of at least `bytes`, in use from now on: held by `request` once hold() is called (by every
  // request hold() is given, for a piece sent to several peers); `kept`: also after the requests are done,
  // until pass_on() or release() (a received payload that is still to be read or forwarded). Without hold(),
  // until release_all().
  char* take(size_t bytes);
  void hold(RequestPtr request, bool kept = false);
  // The buffer `from` holds is held by `to` instead (a later request: a forward of what `from` received).
  void pass_on(const RequestPtr& from, RequestPtr to);
  void release(const RequestPtr& from);
  void release_all();  // after a collective: none of its requests is pending any more

 private:
  struct Entry {
    std::vector<char> bytes;
    RequestPtr request;              // the request that holds it (the latest given)
    std::vector<RequestPtr> others;  // the earlier ones, when several read it
    bool kept = false;
    bool done() const;               // every request that holds it is done
  };
  Entry* find(const RequestPtr& request);  // the entry `request` holds, or null
  std::deque<Entry> in_use_;  // in posting order: the oldest requests finish first
  std::vector<std::vector<char>> free_;
};

// Where the result of a reduction goes next: a frame of this collective to `peer`.
struct Onward {
  int peer;
  uint64_t offset;
  uint32_t step;
};

class Collective {
 public:
  // `reduce_threads`: how many threads may share one piece's element-wise work (MCCL_REDUCE_THREADS).
  Collective(Transport& transport, const Config& config, size_t reduce_threads, std::vector<char>* scratch,
             WireBuffers* wire, FrameHeader identity, Deadline deadline);

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  const Config& config() const { return config_; }
  DataType dtype() const { return static_cast<DataType>(identity_.dtype); }
  ReduceOp op() const { return static_cast<ReduceOp>(identity_.reduce_op); }

  // Frames of this collective, in the format of its codec (codec.h): callers hand over and get back their
  // own data, whatever travels. Sizes are bytes of that data; offsets, logical byte offsets in the buffer.
  // This rank's values.
  RequestPtr send(int peer, const void* data, size_t bytes, uint64_t offset, uint32_t step);
  // Values that land in `data` (decoded as they arrive).
  RequestPtr recv(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step);
  // The same with `count` in the header instead of the collective's element count, for collectives whose
  // messages legitimately differ in size (alltoall splits); at offset 0.
  RequestPtr send_counted(int peer, const void* data, size_t bytes, uint64_t count, uint32_t step);
  RequestPtr recv_counted(int peer, void* data, size_t bytes, uint64_t count, uint32_t step);
  // recv() whose frame can then go on to another rank as it came (forward): not decoded and encoded again,
  // nor rounded twice.
  RequestPtr recv_to_forward(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step);
  RequestPtr forward(int peer, const RequestPtr& received, uint64_t offset, uint32_t step);
  // A contribution to fold into data of this rank (reduce_received, reduce_and_send), received where the
  // codec keeps it until then (a wire buffer: decoded inside the reduction, one pass over memory).
  RequestPtr recv_to_reduce(int peer, size_t bytes, uint64_t offset, uint32_t step);
  // dst OP= what `received` brought; with `own` (this rank's values, kept elsewhere: a collective's read-only
  // input), dst = own OP what `received` brought, copied in the same pass, piece by piece.
  void reduce_received(void* dst, const RequestPtr& received, size_t bytes, const void* own = nullptr);
  // The same, and the result goes on as the frame `to`, encoded in the same pass.
  RequestPtr reduce_and_send(void* dst, const RequestPtr& received, size_t bytes, const Onward& to,
                             const void* own = nullptr);
  // The last contribution to a piece this rank keeps and sends on (an allreduce's own segment): reduce_and_send,
  // divided by size() for AVG, and `dst` left with what the receivers will hold.
  RequestPtr reduce_final_and_send(void* dst, const RequestPtr& received, size_t bytes, const Onward& to);
  // Data this rank keeps and also sends, rounded in place to what the others will receive.
  void keep_as_sent(void* data, size_t bytes);

  // Payloads in their wire form already (an 8-bit allreduce's encoded buffer, algorithms/int8_allreduce.cc): the
  // wire form of `count` elements, sent from `wire` as it is, or received into it as it comes.
  RequestPtr send_encoded(int peer, const char* wire, size_t count, uint64_t offset, uint32_t step);
  RequestPtr recv_encoded(int peer, char* wire, size_t count, uint64_t offset, uint32_t step);
  // The codec's conversions of whole buffers (element-wise over the reduce threads). encode: see Codec::encode
  // (`error`: error feedback, or null).
  void encode(char* wire, const void* data, size_t count, float* error);
  void decode(void* data, const char* wire, size_t count);
  // reduce_final_and_send to every destination in `to`, the result encoded into `into` (wire_bytes of the
  // piece, memory of the caller's, which the sends read) and the error of that encoding added to `error` (null:
  // none), as Fold says; appends the sends to `sends`.
  void reduce_final_into(void* dst, const RequestPtr& received, size_t bytes, char* into, float* error,
                         const std::vector<Onward>& to, std::vector<RequestPtr>* sends);

  void wait(const RequestPtr& request) { transport_.wait(request, deadline_); }
  void wait_all(const std::vector<RequestPtr>& requests) { transport_.wait_all(requests, deadline_); }

  // Reusable buffers owned by the communicator (slot 0 or 1), at least `bytes` long; contents undefined.
  char* scratch(int slot, size_t bytes);

  // Pipelining unit for a ring step, a whole number of elements: about MCCL_CHUNK_BYTES on the wire, so a
  // compressed float32 piece holds more elements (and its frames reach the sender thread's size).
  size_t piece_bytes() const { return piece_bytes_; }

 private:
  // This collective's header for one frame: its identity with this offset, count and step.
  FrameHeader frame(uint64_t offset, uint64_t count, uint32_t step) const;
  size_t elements(size_t bytes) const { return bytes / element_size_; }
  RequestPtr post_send(int peer, const FrameHeader& header, const void* data, size_t bytes);
  RequestPtr post_recv(int peer, const FrameHeader& header, void* data, size_t bytes, bool kept);
  // `how.onward`: where the result is encoded (null: a wire buffer of the communicator's).
  void fold_and_send(void* dst, const RequestPtr& received, size_t bytes, const Onward* to, size_t destinations,
                     const Fold& how, std::vector<RequestPtr>* sends);

  Transport& transport_;
  const Config& config_;
  std::vector<char>* scratch_;  // two slots
  WireBuffers* wire_;
  FrameHeader identity_;
  Deadline deadline_;
  std::shared_ptr<const Codec> codec_;  // shared with the decoding callbacks of its receives
  size_t element_size_;
  size_t piece_bytes_;
};

}  // namespace mccl
