// One collective call in flight: who it is (kind, sequence number, dtype, op, root, count), its
// deadline, and helpers that post its frames. Algorithms (algorithms/*.cc) only see this.
#pragma once

#include <cstdint>
#include <vector>

#include "config.h"
#include "dtype.h"
#include "transport.h"
#include "wire.h"

namespace mccl {

// A part of a logical buffer: where it lives here, its size, and its byte offset in the logical
// buffer (the offset travels in headers, so both sides agree on what each frame holds).
struct Segment {
  char* data = nullptr;
  size_t bytes = 0;
  uint64_t offset = 0;
};

class Collective {
 public:
  Collective(Transport& transport, const Config& config, std::vector<char>* scratch, FrameHeader identity,
             Deadline deadline)
      : transport_(transport), config_(config), scratch_(scratch), identity_(identity), deadline_(deadline) {}

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  const Config& config() const { return config_; }
  DataType dtype() const { return static_cast<DataType>(identity_.dtype); }
  ReduceOp op() const { return static_cast<ReduceOp>(identity_.reduce_op); }

  // Frames of this collective. `count_override` replaces the header's element count for collectives
  // whose messages legitimately differ in size (alltoall splits).
  RequestPtr send(int peer, const void* data, size_t bytes, uint64_t offset, uint32_t step);
  RequestPtr recv(int peer, void* data, size_t bytes, uint64_t offset, uint32_t step);
  RequestPtr send_counted(int peer, const void* data, size_t bytes, uint64_t count, uint32_t step);
  RequestPtr recv_counted(int peer, void* data, size_t bytes, uint64_t count, uint32_t step);
  void wait(const RequestPtr& request) { transport_.wait(request, deadline_); }
  void wait_all(const std::vector<RequestPtr>& requests) { transport_.wait_all(requests, deadline_); }

  // Reusable buffers owned by the communicator (slot 0 or 1), at least `bytes` long; contents undefined.
  char* scratch(int slot, size_t bytes);

  // Pipelining unit for a ring step, a whole number of elements.
  size_t piece_bytes(size_t element_size) const;

 private:
  // This collective's header for one frame: its identity with this offset, count and step.
  FrameHeader frame(uint64_t offset, uint64_t count, uint32_t step) const;

  Transport& transport_;
  const Config& config_;
  std::vector<char>* scratch_;  // two slots
  FrameHeader identity_;
  Deadline deadline_;
};

}  // namespace mccl
