// One collective call in flight: who it is (kind, sequence number, dtype, op, root, count), its
// deadline, and helpers that post its frames. Algorithms (algorithms/*.cc) only see this.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

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
};

// Buffers for compressed payloads (MCCL_WIRE_DTYPE), owned by the communicator and reused: each one is
// held by the request that uses it and goes back to the free list once that request is done, so the
// memory in use is what is in flight, not the whole message.
class WireBuffers {
 public:
  // A buffer of at least `bytes`, in use from now on: held by `request` once hold() is called; `kept`: also
  // after the request is done, until pass_on() or release() (a received payload that is still to be read
  // or forwarded). Without hold(), until release_all().
  char* take(size_t bytes);
  void hold(RequestPtr request, bool kept = false) {
    in_use_.back().request = std::move(request);
    in_use_.back().kept = kept;
  }
  // The buffer `from` holds is held by `to` instead (a later request: a forward of what `from` received).
  void pass_on(const RequestPtr& from, RequestPtr to);
  void release(const RequestPtr& from);
  void release_all();  // after a collective: none of its requests is pending any more

 private:
  struct Entry {
    std::vector<char> bytes;
    RequestPtr request;
    bool kept = false;
  };
  Entry* find(const RequestPtr& request);  // the entry `request` holds, or null
  std::deque<Entry> in_use_;  // in posting order: the oldest requests finish first
  std::vector<std::vector<char>> free_;
};

class Collective {
 public:
  // `reduce_threads`: how many threads may share one piece's element-wise work (MCCL_REDUCE_THREADS).
  Collective(Transport& transport, const Config& config, size_t reduce_threads, std::vector<char>* scratch,
             WireBuffers* wire, FrameHeader identity, Deadline deadline)
      : transport_(transport), config_(config), reduce_threads_(reduce_threads), scratch_(scratch), wire_(wire),
        identity_(identity), deadline_(deadline) {}

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  const Config& config() const { return config_; }
  DataType dtype() const { return static_cast<DataType>(identity_.dtype); }
  ReduceOp op() const { return static_cast<ReduceOp>(identity_.reduce_op); }

  // Frames of this collective. The _counted forms put `count` in the header instead of the collective's
  // element count, for collectives whose messages legitimately differ in size (alltoall splits).
  // With wire compression (compressed()), send narrows float32 data into a wire buffer and recv widens
  // into `data` when the frame arrives; callers see float32 either way.
  RequestPtr send(int peer, const void* data, size_t bytes, uint64_t offset, uint32_t step);
  RequestPtr recv(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step);
  RequestPtr send_counted(int peer, const void* data, size_t bytes, uint64_t count, uint32_t step);
  // Sends on what `received` (a finished recv of this collective) brought, as it arrived: a compressed
  // payload goes on as it came, not widened and narrowed again (nor rounded twice).
  // `received` must come from recv_to_forward.
  RequestPtr forward(int peer, const RequestPtr& received, uint64_t offset, uint32_t step);
  // recv() whose payload stays available to forward() (compressed: its wire buffer is kept).
  RequestPtr recv_to_forward(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step);
  // A receive whose payload reduce_received() then folds into the caller's buffer. Uncompressed it lands
  // in `landing`; compressed it stays in a wire buffer and is widened tile by tile inside the reduction
  // (one pass over memory, not a float32 copy first), and `landing` is not used (null will do).
  RequestPtr recv_for_reduce(int peer, void* landing, size_t bytes, uint64_t offset, uint32_t step);
  // `narrowed` (from wire_buffer, or null): the result is also narrowed into it in the same pass, for
  // send_narrowed to send on (the reduce-scatter's forward of a partial sum).
  void reduce_received(void* dst, const RequestPtr& received, size_t bytes, char* narrowed = nullptr) {
    reduce_piece(dst, received, bytes, narrowed, false);
  }
  // reduce_received() of the last contribution to a piece this rank keeps and sends on (an allreduce's own
  // segment): then divided by size() for AVG, and compressed, narrowed into `narrowed` while `dst` keeps
  // the rounded values, which are what the ranks that receive them will hold.
  void reduce_final(void* dst, const RequestPtr& received, size_t bytes, char* narrowed) {
    reduce_piece(dst, received, bytes, narrowed, true);
  }
  // A wire buffer for `bytes` of float32 data; null when uncompressed. Post it (send_narrowed) before the
  // next wire_buffer or send.
  char* wire_buffer(size_t bytes);
  // send() of `data` (float32, `bytes`) whose wire form is already in `narrowed` (null: send `data`).
  RequestPtr send_narrowed(int peer, const void* data, char* narrowed, size_t bytes, uint64_t offset,
                           uint32_t step);
  RequestPtr recv_counted(int peer, void* data, size_t bytes, uint64_t count, uint32_t step);
  void wait(const RequestPtr& request) { transport_.wait(request, deadline_); }
  void wait_all(const std::vector<RequestPtr>& requests) { transport_.wait_all(requests, deadline_); }

  // dst OP= src over `count` elements of the collective's dtype, split over MCCL_REDUCE_THREADS threads.
  void reduce(void* dst, const void* src, size_t count) const;

  // Whether float32 payloads travel compressed (MCCL_WIRE_DTYPE) in this collective.
  bool compressed() const { return identity_.wire_dtype != 0; }
  // Rounds float32 values to the wire type in place (no-op unless compressed()): for data this rank keeps
  // and also sends, so that it holds the same bits as the ranks that receive it.
  void round_to_wire(void* data, size_t bytes);

  // Reusable buffers owned by the communicator (slot 0 or 1), at least `bytes` long; contents undefined.
  char* scratch(int slot, size_t bytes);

  // Pipelining unit for a ring step, a whole number of elements: MCCL_CHUNK_BYTES on the wire, so a
  // compressed float32 piece holds twice the elements (and its frames reach the sender thread's size).
  size_t piece_bytes(size_t element_size) const;

 private:
  // This collective's header for one frame: its identity with this offset, count and step.
  FrameHeader frame(uint64_t offset, uint64_t count, uint32_t step) const;
  // Compressed: the type on the wire, and the size there of `bytes` of float32 data.
  DataType wire_type() const { return static_cast<DataType>(identity_.wire_dtype); }
  size_t wire_bytes(size_t bytes) const { return bytes / sizeof(float) * dtype_size(wire_type()); }
  RequestPtr post_send(int peer, const FrameHeader& header, const void* data, size_t bytes);
  RequestPtr post_recv(int peer, const FrameHeader& header, void* data, size_t bytes, bool kept = false);
  void reduce_piece(void* dst, const RequestPtr& received, size_t bytes, char* narrowed, bool final);

  Transport& transport_;
  const Config& config_;
  size_t reduce_threads_;
  std::vector<char>* scratch_;  // two slots
  WireBuffers* wire_;
  FrameHeader identity_;
  Deadline deadline_;
};

}  // namespace mccl
