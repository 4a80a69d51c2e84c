// The wire format: every connection starts with the handshake (a Hello each way, then a Proof each
// way: see handshake.h), after which every byte is a Frame: a fixed 64-byte header followed by
// `length` payload bytes. Every message starts with the magic and the protocol version.
//
// The header carries enough to detect a mismatched collective before any payload is read: the
// communicator id, the collective's sequence number and kind, dtype, reduce op, root, element count,
// and where this chunk belongs (step, byte offset, length). A receiver knows what it expects next
// from each peer; any difference becomes an error that names both sides instead of corrupt data.
// Integers are in host byte order; the magic doubles as an endianness check (every Mac is little-endian).
#pragma once

#include <cstdint>
#include <string>

#include "dtype.h"

namespace mccl {

constexpr uint32_t kMagic = 0x4C43434D;  // "MCCL" in memory on little-endian hosts
// 1: Hello without authentication. 2: nonce in the Hello, Proof messages, heartbeat control frames.
// 3: several connections per peer (MCCL_NSOCKS), a frame on one of them, lanes part of the matching.
// 4: lanes below matching: a frame's header travels on lane 0 and its payload is split across the lanes
// (transport/peer.h), each lane's share after a LaneHeader; the Hello no longer carries MCCL_CHUNK_BYTES
// (ranks that differ now send frames the others' receives name as a mismatch).
constexpr uint16_t kProtocolVersion = 4;

enum class Channel : uint8_t {
  kCollective = 1,  // seq = the communicator's collective sequence number
  kPointToPoint = 2,  // seq = the user's tag
  kControl = 3,       // kind = ControlKind
};

enum class ControlKind : uint8_t {
  // The sender hit a fatal error and is closing: count = its Error::Kind, payload = the message.
  // Lets every peer report the real cause instead of "connection lost".
  kAbort = 1,
  // "I am alive": sent to a peer that has been sent nothing for MCCL_HEARTBEAT_INTERVAL. No payload.
  kHeartbeat = 2,
};
constexpr uint64_t kMaxControlPayload = 64 * 1024;

enum class CollectiveKind : uint8_t {
  kAllreduce = 1,
  kBroadcast = 2,
  kReduce = 3,
  kAllgather = 4,
  kReduceScatter = 5,
  kGather = 6,
  kScatter = 7,
  kAlltoall = 8,
  kBarrier = 9,
  kSend = 10,
};

const char* collective_name(CollectiveKind kind);

struct FrameHeader {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint8_t channel = 0;
  uint8_t kind = 0;
  uint64_t comm_id = 0;
  uint64_t seq = 0;
  uint8_t dtype = 0;
  uint8_t reduce_op = 0;
  uint16_t root = 0;
  uint32_t src_rank = 0;
  uint64_t count = 0;   // the element count both sides must agree on (per collective, or per message)
  uint64_t offset = 0;  // byte offset of this payload within the logical buffer
  uint64_t length = 0;  // payload bytes that follow this header
  uint32_t step = 0;    // algorithm step, for diagnostics and ordering checks
  uint8_t wire_dtype = 0;  // WireType (codec.h): 0, the payload is `dtype`; else the format it travels in
  uint8_t reserved[3] = {0, 0, 0};
};
static_assert(sizeof(FrameHeader) == 64, "FrameHeader must stay 64 bytes");

// With MCCL_NSOCKS > 1, a frame's share on lanes 1..nsocks-1 starts with this: enough for the receiver to
// check that the bytes are the share it computed from the frame's header (lane 0) before it reads them.
struct LaneHeader {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint8_t channel = 0;
  uint8_t lane = 0;
  uint32_t src_rank = 0;
  uint32_t reserved = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;  // where the share starts in the frame's payload
};
static_assert(sizeof(LaneHeader) == 32, "LaneHeader must stay 32 bytes");

// Which end of a connection a handshake message comes from: the higher rank connects, the lower accepts.
enum class HandshakeRole : uint16_t { kConnector = 1, kAcceptor = 2 };

// First bytes on every connection, sent by both ends. The first 8 bytes (magic, version, and 2 more)
// are the same in every protocol version, so a version mismatch is always recognised as one.
constexpr size_t kNonceBytes = 32;
struct Hello {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint16_t role = 0;  // HandshakeRole
  uint64_t comm_id = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint8_t nonce[kNonceBytes] = {};  // fresh random bytes: the challenge the other end must sign
  uint16_t lane = 0;    // which of the nsocks connections between the two ranks this is
  uint16_t nsocks = 1;  // MCCL_NSOCKS: both ends split payloads across the same number of lanes
  uint32_t reserved0 = 0;
  // The settings that choose an allreduce's schedule (which peers each step talks to). Ranks that differ
  // would each wait on a peer that sends elsewhere, with no frame meeting a receive it could be compared
  // with, until the timeout; so they are refused when they connect.
  uint64_t rd_max_bytes = 0;  // MCCL_RD_MAX_BYTES
  uint8_t algo = 0;           // MCCL_ALGO (AlgoChoice)
  uint8_t selection[4] = {};  // selection_digest (algorithms/select.h), little-endian; 0: all defaults
  uint8_t reserved[3] = {};
};
static_assert(sizeof(Hello) == 80, "Hello must stay 80 bytes");
constexpr size_t kPreambleBytes = 8;  // magic + version + 2 bytes

// The answer to the other end's challenge: HMAC-SHA256(secret, role label || both Hellos).
struct Proof {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint16_t role = 0;  // HandshakeRole of the sender
  uint8_t mac[32] = {};
};
static_assert(sizeof(Proof) == 40, "Proof must stay 40 bytes");

// "allreduce #12 of 1024 float32 (sum)"-style text for messages.
std::string describe(const FrameHeader& h);

// Checks magic and version; returns an empty string when fine, else the reason (naming the likely cause).
std::string check_preamble(uint32_t magic, uint16_t version);

// Everything a receiver can check in a frame header before it reads or allocates anything: magic,
// version, communicator, sender, channel, and a payload length within `max_payload` (MCCL_MAX_MESSAGE_BYTES;
// control frames: kMaxControlPayload, heartbeats: none). Returns "" or the reason.
std::string check_frame_header(const FrameHeader& h, uint64_t comm_id, int sender, uint64_t max_payload);

// Compares a received header with the one this rank expected; returns "" or a description of every
// field that differs, phrased as "rank A sent X, rank B expected Y".
std::string compare_headers(const FrameHeader& expected, const FrameHeader& got, int my_rank);

}  // namespace mccl
