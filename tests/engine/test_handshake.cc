// The handshake state machine (handshake.h) run in memory: the same secret both ways, another secret, a
// forged proof, other protocol versions, other lane or schedule settings, garbage and wrong jobs.
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "handshake.h"
#include "sha256.h"

using namespace mccl;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const uint8_t kNonceA[kNonceBytes] = {1, 2, 3};
const uint8_t kNonceC[kNonceBytes] = {9, 8, 7};

// Runs two in-memory handshakes against each other until neither moves.
void exchange(Handshake& connector, Handshake& acceptor) {
  for (int round = 0; round < 10; ++round) {
    size_t moved = 0;
    if (connector.output_size() > 0) {
      size_t n = acceptor.feed(connector.output(), connector.output_size());
      connector.sent(n);
      moved += n;
    }
    if (acceptor.output_size() > 0) {
      size_t n = connector.feed(acceptor.output(), acceptor.output_size());
      acceptor.sent(n);
      moved += n;
    }
    if (moved == 0) return;
  }
}

}  // namespace

TEST(handshake_with_the_same_secret_succeeds_both_ways) {
  const std::string secret = "0123456789abcdef-the-job-secret";
  Handshake connector(HandshakeRole::kConnector, secret, 42, 3, 4, 1, kNonceC);
  Handshake acceptor(HandshakeRole::kAcceptor, secret, 42, 1, 4, -1, kNonceA);
  exchange(connector, acceptor);
  CHECK_MSG(connector.finished(), "%s", connector.error().c_str());
  CHECK_MSG(acceptor.finished(), "%s", acceptor.error().c_str());
  CHECK(acceptor.peer_rank() == 3 && connector.peer_rank() == 1);
}

TEST(handshake_with_another_secret_is_rejected_by_the_acceptor) {
  Handshake connector(HandshakeRole::kConnector, "a-secret-of-the-other-job", 42, 3, 4, 1, kNonceC);
  Handshake acceptor(HandshakeRole::kAcceptor, "0123456789abcdef-the-job-secret", 42, 1, 4, -1, kNonceA);
  exchange(connector, acceptor);
  CHECK(acceptor.state() == Handshake::State::kFailed);
  CHECK_MSG(contains(acceptor.error(), "authentication") && contains(acceptor.error(), "MCCL_AUTH_SECRET"), "%s",
            acceptor.error().c_str());
  CHECK(acceptor.output_size() == 0);  // it proved nothing to a client that did not prove itself
  CHECK(!connector.finished());
}

TEST(handshake_rejects_a_forged_acceptor_proof) {
  // A connector talking to something that has the right Hello but not the secret.
  const std::string secret = "0123456789abcdef-the-job-secret";
  Handshake connector(HandshakeRole::kConnector, secret, 42, 2, 3, 0, kNonceC);
  Handshake impostor(HandshakeRole::kAcceptor, "impostor-guessing-the-secret", 42, 0, 3, -1, kNonceA);
  // The impostor skips verification: feed the connector its Hello, then a proof made with its own key.
  impostor.feed(connector.output(), connector.output_size());
  connector.sent(connector.output_size());
  connector.feed(impostor.output(), sizeof(Hello));
  Proof forged;
  forged.role = static_cast<uint16_t>(HandshakeRole::kAcceptor);
  std::memset(forged.mac, 0x5a, sizeof(forged.mac));
  connector.feed(reinterpret_cast<const uint8_t*>(&forged), sizeof(forged));
  CHECK(connector.state() == Handshake::State::kFailed);
  CHECK_MSG(contains(connector.error(), "authentication"), "%s", connector.error().c_str());
}

TEST(handshake_names_both_protocol_versions) {
  const std::string secret = "0123456789abcdef-the-job-secret";
  const std::string ours = "speaks " + std::to_string(kProtocolVersion);
  // Older peers connect (version 1: a 24-byte Hello; version 2: 56 bytes): the 8-byte preamble is the same.
  for (uint16_t version : {1, 2}) {
    Hello old;
    old.version = version;
    Handshake acceptor(HandshakeRole::kAcceptor, secret, 42, 0, 2, -1, kNonceA);
    acceptor.feed(reinterpret_cast<const uint8_t*>(&old), version == 1 ? 24 : 56);
    CHECK(acceptor.state() == Handshake::State::kFailed);
    CHECK_MSG(contains(acceptor.error(), "version " + std::to_string(version)) && contains(acceptor.error(), ours),
              "%s", acceptor.error().c_str());
    CHECK(acceptor.output_size() == sizeof(Hello));  // it answers with its own Hello, so the peer can say so too
  }
  // A connector that meets a newer acceptor says the same.
  Handshake connector(HandshakeRole::kConnector, secret, 42, 1, 2, 0, kNonceC);
  Hello newer;
  newer.version = kProtocolVersion + 1;
  connector.feed(reinterpret_cast<const uint8_t*>(&newer), sizeof(newer));
  CHECK_MSG(contains(connector.error(), "version " + std::to_string(kProtocolVersion + 1)) && contains(connector.error(), ours),
            "%s", connector.error().c_str());
}

// Both ends split payloads across MCCL_NSOCKS lanes, and MCCL_ALGO / MCCL_RD_MAX_BYTES and the other
// collectives' algorithm settings (their digest) choose which peers each step talks to: ranks that differ are
// told so when they connect, naming the variable.
TEST(handshake_rejects_peers_with_other_lane_or_schedule_settings) {
  const std::string secret = "0123456789abcdef-the-job-secret";
  struct Case {
    LaneSpec connector, acceptor;
    const char* expect;
  } cases[] = {{{0, 2, 0, 0}, {0, 1, 0, 0}, "MCCL_NSOCKS=2"},
               {{0, 1, 0, 1}, {0, 1, 0, 0}, "MCCL_ALGO=ring"},
               {{0, 1, 4096, 0}, {0, 1, 0, 0}, "MCCL_RD_MAX_BYTES=4096"},
               {{0, 1, 0, 0, 0x1234}, {0, 1, 0, 0, 0}, "other algorithm settings (MCCL_BROADCAST_ALGO"},
               {{3, 2, 0, 0}, {0, 2, 0, 0}, "lane 3 is out of range"}};
  for (const Case& c : cases) {
    Handshake connector(HandshakeRole::kConnector, secret, 42, 1, 2, 0, kNonceC, c.connector);
    Handshake acceptor(HandshakeRole::kAcceptor, secret, 42, 0, 2, -1, kNonceA, c.acceptor);
    exchange(connector, acceptor);
    CHECK(!acceptor.finished() && !connector.finished());
    CHECK_MSG(contains(acceptor.error(), c.expect), "expected '%s' in '%s'", c.expect, acceptor.error().c_str());
  }
  // Lane 1 of 2: both ends agree on the lane.
  Handshake connector(HandshakeRole::kConnector, secret, 42, 1, 2, 0, kNonceC, {1, 2});
  Handshake acceptor(HandshakeRole::kAcceptor, secret, 42, 0, 2, -1, kNonceA, {0, 2});
  exchange(connector, acceptor);
  CHECK_MSG(connector.finished() && acceptor.finished(), "%s / %s", connector.error().c_str(), acceptor.error().c_str());
  CHECK(acceptor.peer_lane() == 1 && connector.peer_lane() == 1);
}

TEST(handshake_rejects_garbage_and_wrong_jobs_without_answering) {
  const std::string secret = "0123456789abcdef-the-job-secret";
  Handshake acceptor(HandshakeRole::kAcceptor, secret, 42, 0, 2, -1, kNonceA);
  const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  size_t taken = acceptor.feed(reinterpret_cast<const uint8_t*>(garbage), sizeof(garbage));
  CHECK(taken == kPreambleBytes);  // it reads no further than the preamble
  CHECK_MSG(contains(acceptor.error(), "bad magic"), "%s", acceptor.error().c_str());
  CHECK(acceptor.output_size() == 0);

  struct Case {
    uint64_t comm_id;
    uint32_t rank, world;
    uint16_t role;
    const char* expect;
  } cases[] = {{7, 1, 2, 1, "another communicator"},
               {42, 1, 3, 1, "world size is 3"},
               {42, 9, 2, 1, "out of range"},
               {42, 0, 2, 1, "lower or equal rank"},
               {42, 1, 2, 2, "acceptor"}};
  for (const Case& c : cases) {
    Handshake a(HandshakeRole::kAcceptor, secret, 42, 0, 2, -1, kNonceA);
    Hello h;
    h.comm_id = c.comm_id;
    h.rank = c.rank;
    h.world_size = c.world;
    h.role = c.role;
    a.feed(reinterpret_cast<const uint8_t*>(&h), sizeof(h));
    CHECK_MSG(a.state() == Handshake::State::kFailed && contains(a.error(), c.expect), "expected '%s', got '%s'",
              c.expect, a.error().c_str());
    CHECK(a.output_size() == 0);
  }
}

MCCL_TEST_MAIN
