#include "handshake.h"

#include <algorithm>
#include <cstring>

#include "sha256.h"

namespace mccl {
namespace {

const char kConnectorLabel[] = "mccl handshake v3: connector proof";
const char kAcceptorLabel[] = "mccl handshake v3: acceptor proof";

const char* algo_name(uint8_t algo) {
  switch (algo) {
    case 0: return "auto";
    case 1: return "ring";
    case 2: return "rd";
  }
  return "unknown";
}

const char* role_name(uint16_t role) {
  if (role == static_cast<uint16_t>(HandshakeRole::kConnector)) return "connector";
  if (role == static_cast<uint16_t>(HandshakeRole::kAcceptor)) return "acceptor";
  return "unknown role";
}

}  // namespace

Handshake::Handshake(HandshakeRole role, const std::string& secret, uint64_t comm_id, int rank, int world_size,
                     int peer, const uint8_t* nonce, const LaneSpec& lanes)
    : role_(role), secret_(secret), comm_id_(comm_id), rank_(rank), world_size_(world_size), expected_peer_(peer) {
  mine_.role = static_cast<uint16_t>(role);
  mine_.lane = static_cast<uint16_t>(lanes.lane);
  mine_.nsocks = static_cast<uint16_t>(lanes.nsocks);
  mine_.rd_max_bytes = lanes.rd_max_bytes;
  mine_.algo = lanes.algo;
  for (int i = 0; i < 4; ++i) mine_.selection[i] = static_cast<uint8_t>(lanes.selection >> (8 * i));
  mine_.comm_id = comm_id;
  mine_.rank = static_cast<uint32_t>(rank);
  mine_.world_size = static_cast<uint32_t>(world_size);
  std::memcpy(mine_.nonce, nonce, kNonceBytes);
  // The connector speaks first; the acceptor says nothing until it has seen a Hello of this job.
  if (role == HandshakeRole::kConnector) queue(&mine_, sizeof(mine_));
}

void Handshake::sent(size_t bytes) {
  out_sent_ += std::min(bytes, output_size());
  if (out_sent_ == out_size_) out_sent_ = out_size_ = 0;
}

void Handshake::queue(const void* data, size_t size) {
  if (out_sent_ > 0) {  // keep the unsent rest at the front
    std::memmove(out_, out_ + out_sent_, out_size_ - out_sent_);
    out_size_ -= out_sent_;
    out_sent_ = 0;
  }
  // Never more than a Hello and a Proof are pending, which is what out_ holds.
  std::memcpy(out_ + out_size_, data, size);
  out_size_ += size;
}

void Handshake::fail(std::string why) {
  state_ = State::kFailed;
  step_ = Step::kNone;
  error_ = std::move(why);
}

size_t Handshake::wants() const {
  if (state_ != State::kRunning) return 0;
  switch (step_) {
    case Step::kPeerPreamble: return kPreambleBytes - in_got_;
    case Step::kPeerHello: return sizeof(Hello) - in_got_;
    case Step::kPeerProof: return sizeof(Proof) - in_got_;
    case Step::kNone: return 0;
  }
  return 0;
}

size_t Handshake::feed(const uint8_t* data, size_t size) {
  size_t taken = 0;
  while (taken < size && wants() > 0) {
    size_t take = std::min(size - taken, wants());
    std::memcpy(in_ + in_got_, data + taken, take);
    in_got_ += take;
    taken += take;
    if (wants() == 0) on_message();
  }
  return taken;
}

void Handshake::on_message() {
  switch (step_) {
    case Step::kPeerPreamble: on_preamble(); break;
    case Step::kPeerHello: on_hello(); break;
    case Step::kPeerProof: on_proof(); break;
    case Step::kNone: break;
  }
}

// The first 8 bytes: is this MCCL at all, and the same protocol version? An acceptor answers a
// version mismatch with its own Hello before closing, so that the other end can name both versions.
void Handshake::on_preamble() {
  uint32_t magic;
  uint16_t version;
  std::memcpy(&magic, in_, sizeof(magic));
  std::memcpy(&version, in_ + sizeof(magic), sizeof(version));
  std::string bad = check_preamble(magic, version);
  if (!bad.empty()) {
    if (magic == kMagic && role_ == HandshakeRole::kAcceptor) queue(&mine_, sizeof(mine_));
    fail(bad);
    return;
  }
  step_ = Step::kPeerHello;  // keep the 8 bytes: they are the start of the Hello
}

void Handshake::on_hello() {
  std::memcpy(&theirs_, in_, sizeof(theirs_));
  in_got_ = 0;
  const HandshakeRole expected_role =
      role_ == HandshakeRole::kConnector ? HandshakeRole::kAcceptor : HandshakeRole::kConnector;
  if (theirs_.role != static_cast<uint16_t>(expected_role))
    return fail(std::string("it introduced itself as a ") + role_name(theirs_.role) + ", expected a " +
                role_name(static_cast<uint16_t>(expected_role)));
  if (theirs_.comm_id != comm_id_)
    return fail("it belongs to another communicator (a different job or process group)");
  if (theirs_.world_size != static_cast<uint32_t>(world_size_))
    return fail("it says the world size is " + std::to_string(theirs_.world_size) + ", this rank has " +
                std::to_string(world_size_));
  if (theirs_.rank >= static_cast<uint32_t>(world_size_))
    return fail("its rank " + std::to_string(theirs_.rank) + " is out of range");
  if (theirs_.nsocks != mine_.nsocks)
    return fail("it has MCCL_NSOCKS=" + std::to_string(theirs_.nsocks) + ", this rank " + std::to_string(mine_.nsocks) +
                ": set the same value on every host");
  if (theirs_.rd_max_bytes != mine_.rd_max_bytes)
    return fail("it has MCCL_RD_MAX_BYTES=" + std::to_string(theirs_.rd_max_bytes) + ", this rank " +
                std::to_string(mine_.rd_max_bytes) + ": set the same value on every host");
  if (theirs_.algo != mine_.algo)
    return fail(std::string("it has MCCL_ALGO=") + algo_name(theirs_.algo) + ", this rank " + algo_name(mine_.algo) +
                ": set the same value on every host");
  if (std::memcmp(theirs_.selection, mine_.selection, sizeof mine_.selection) != 0)
    return fail("it has other algorithm settings (MCCL_BROADCAST_ALGO, MCCL_REDUCE_ALGO, MCCL_ALLGATHER_ALGO, "
                "MCCL_REDUCE_SCATTER_ALGO, MCCL_INT8_ALGO or their *_MAX_BYTES thresholds) than this rank: set the "
                "same values on every host");
  if (theirs_.lane >= theirs_.nsocks) return fail("its lane " + std::to_string(theirs_.lane) + " is out of range");
  if (role_ == HandshakeRole::kConnector && theirs_.lane != mine_.lane)
    return fail("it answered for lane " + std::to_string(theirs_.lane) + ", not " + std::to_string(mine_.lane));
  const int peer = static_cast<int>(theirs_.rank);
  if (role_ == HandshakeRole::kConnector && peer != expected_peer_)
    return fail("it says it is rank " + std::to_string(peer));
  if (role_ == HandshakeRole::kAcceptor && peer <= rank_)
    return fail("rank " + std::to_string(peer) + " should not connect to a lower or equal rank");
  peer_rank_ = peer;
  step_ = Step::kPeerProof;
  if (role_ == HandshakeRole::kAcceptor) {
    mine_.lane = theirs_.lane;     // the acceptor answers for the lane it was dialled on
    queue(&mine_, sizeof(mine_));  // our challenge; we prove nothing before the connector has
  } else {
    Proof proof = make_proof(HandshakeRole::kConnector);
    queue(&proof, sizeof(proof));
  }
}

void Handshake::on_proof() {
  Proof theirs;
  std::memcpy(&theirs, in_, sizeof(theirs));
  in_got_ = 0;
  const HandshakeRole peer_role =
      role_ == HandshakeRole::kConnector ? HandshakeRole::kAcceptor : HandshakeRole::kConnector;
  Proof expected = make_proof(peer_role);
  // Compare the whole message (framing and MAC) in constant time.
  if (!constant_time_equal(&theirs, &expected, sizeof(expected))) {
    return fail("it failed authentication: it does not know this job's secret (MCCL_AUTH_SECRET or "
                "MCCL_AUTH_SECRET_FILE differs between the hosts, or it is not part of this job)");
  }
  if (role_ == HandshakeRole::kAcceptor) {
    Proof proof = make_proof(HandshakeRole::kAcceptor);
    queue(&proof, sizeof(proof));
  }
  state_ = State::kDone;
  step_ = Step::kNone;
}

// HMAC over a role label and both Hellos (connector's first): binds the proof to this communicator,
// both ranks, the world size, the protocol version and both nonces.
Proof Handshake::make_proof(HandshakeRole role) const {
  const Hello& connector = role_ == HandshakeRole::kConnector ? mine_ : theirs_;
  const Hello& acceptor = role_ == HandshakeRole::kConnector ? theirs_ : mine_;
  const char* label = role == HandshakeRole::kConnector ? kConnectorLabel : kAcceptorLabel;
  const Bytes parts[] = {{label, std::strlen(label) + 1}, {&connector, sizeof(connector)}, {&acceptor, sizeof(acceptor)}};
  Digest mac = hmac_sha256(secret_.data(), secret_.size(), parts, 3);
  Proof proof;
  proof.role = static_cast<uint16_t>(role);
  std::memcpy(proof.mac, mac.data(), mac.size());
  return proof;
}

}  // namespace mccl
