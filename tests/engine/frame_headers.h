// The point-to-point frame header that the transport tests (test_liveness.cc, test_lanes.cc) post and the
// wire fuzzer (tests/fuzz/fuzz_wire.cc) sends: what Communicator::post_p2p builds for a byte message.
#pragma once

#include <cstdint>

#include "wire.h"

namespace mccl_test {

// A send/recv of `count` uint8 elements under the user's `tag` (the header's seq on the p2p channel).
// Comm id, sender and payload length are left for the transport (or the fuzzer) to fill in.
inline mccl::FrameHeader p2p_header(uint64_t tag, uint64_t count = 0) {
  mccl::FrameHeader h;
  h.channel = static_cast<uint8_t>(mccl::Channel::kPointToPoint);
  h.kind = static_cast<uint8_t>(mccl::CollectiveKind::kSend);
  h.seq = tag;
  h.dtype = static_cast<uint8_t>(mccl::DataType::kUInt8);
  h.count = count;
  return h;
}

}  // namespace mccl_test
