// The connection handshake, as a state machine over bytes (no sockets: bootstrap.cc moves the bytes,
// the fuzz target feeds it garbage).
//
// Mutual challenge-response over a shared secret. The higher rank connects ("connector"), the lower
// one accepts ("acceptor"):
//
//   connector -> acceptor   Hello{comm_id, rank, world size, nonce_c}
//   acceptor  -> connector  Hello{comm_id, rank, world size, nonce_a}
//   connector -> acceptor   Proof{HMAC(secret, "connector" label || Hello_c || Hello_a)}
//   acceptor  -> connector  Proof{HMAC(secret, "acceptor" label || Hello_c || Hello_a)}
//
// Each side checks the other's Hello (magic, version, communicator, world size, rank) and then its
// proof, with a constant-time compare; only then is the connection used. Both nonces are fresh random
// bytes, so a recorded proof is useless on another connection, and the acceptor proves nothing until
// the connector has: an unauthenticated client gets no MAC to work with. Every message is fixed-size
// and read into a fixed buffer, so nothing a peer sends can make this allocate or overrun.
//
// This authenticates connection setup. It does not encrypt or sign the data that follows: someone
// who can rewrite packets on the path can still take over an established connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "wire.h"

namespace mccl {

// Which connection between two ranks this is, how many there are, and the settings that choose an
// allreduce's schedule (see Hello).
struct LaneSpec {
  int lane = 0;   // a connector's lane; an acceptor learns it from the Hello (peer_lane())
  int nsocks = 1;
  uint64_t rd_max_bytes = 0;
  uint8_t algo = 0;
  uint32_t selection = 0;  // selection_digest: the other collectives' algorithm settings
};

class Handshake {
 public:
  enum class State { kRunning, kDone, kFailed };

  // `peer`: the rank a connector dials; an acceptor takes any rank above its own (checked) and
  // learns it from the Hello. `nonce`: kNonceBytes fresh random bytes (tests and the fuzzer pass fixed ones).
  Handshake(HandshakeRole role, const std::string& secret, uint64_t comm_id, int rank, int world_size, int peer,
            const uint8_t* nonce, const LaneSpec& lanes = LaneSpec());

  // Bytes to send now. The caller sends them (all or some) and reports how many with sent().
  const uint8_t* output() const { return out_ + out_sent_; }
  size_t output_size() const { return out_size_ - out_sent_; }
  void sent(size_t bytes);

  // How many more bytes the handshake wants to read now (0: nothing until the output is sent, or finished).
  size_t wants() const;
  // Takes up to wants() bytes; returns how many it took.
  size_t feed(const uint8_t* data, size_t size);

  State state() const { return state_; }
  // Done and everything sent: the connection can carry frames.
  bool finished() const { return state_ == State::kDone && output_size() == 0; }
  // Why it failed (for the log or the error), naming the likely cause.
  const std::string& error() const { return error_; }
  // The other end's rank once its Hello was accepted, else -1.
  int peer_rank() const { return peer_rank_; }
  // The lane the peer's Hello named (acceptors: which of its nsocks connections this is).
  int peer_lane() const { return theirs_.lane; }
  // True once the peer sent a Hello that parsed as this job's (its proof may still fail).
  bool peer_introduced() const { return peer_rank_ >= 0; }

 private:
  enum class Step { kPeerPreamble, kPeerHello, kPeerProof, kNone };
  void on_message();
  void on_preamble();
  void on_hello();
  void on_proof();
  void queue(const void* data, size_t size);
  void fail(std::string why);
  Proof make_proof(HandshakeRole role) const;

  HandshakeRole role_;
  std::string secret_;
  uint64_t comm_id_;
  int rank_;
  int world_size_;
  int peer_rank_ = -1;
  int expected_peer_;
  Hello mine_;
  Hello theirs_;
  State state_ = State::kRunning;
  Step step_ = Step::kPeerPreamble;
  std::string error_;
  // The message being read, and what is to be sent: both bounded by the largest message.
  uint8_t in_[sizeof(Hello)] = {};
  size_t in_got_ = 0;
  uint8_t out_[sizeof(Hello) + sizeof(Proof)] = {};
  size_t out_size_ = 0;
  size_t out_sent_ = 0;
};

}  // namespace mccl
