// Fuzz target for everything MCCL parses from the network: the handshake (both roles), frame headers,
// and a Transport reading a byte stream from a peer (through a socket pair).
//
// The first input byte picks the mode and its options; the rest is what the peer "sent":
//   mode 0  acceptor handshake, fed the bytes in chunks (sizes from the option bits)
//   mode 1  connector handshake, likewise
//   mode 2  frame-header checks, describe() and compare_headers() on 64-byte windows
//   mode 3  a 2-rank Transport (this is rank 0) with receives posted, reading the bytes from rank 1
// Any crash, sanitizer report, or broken invariant (abort() below) is a finding. In particular the
// handshake must never succeed when this side's secret is not the one the seeds were made with.
#include "fuzz_wire.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "../engine/frame_headers.h"
#include "error.h"
#include "handshake.h"
#include "transport/transport.h"
#include "wire.h"

namespace {

using namespace mccl;

constexpr uint64_t kCommId = 0x1234;
constexpr int kWorld = 2;
const std::string kSecret = "fuzzing-secret-0123456789abcdef";
const std::string kOtherSecret = "some-other-secret-0123456789abc";
const uint8_t kNonce[kNonceBytes] = {0xa5, 0x5a, 0x01};
constexpr uint64_t kMaxMessage = 1 << 20;

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "fuzz_wire: invariant violated: %s\n", what);
  std::abort();
}

// Modes 0 and 1. The acceptor is rank 0, the connector rank 1 dialling rank 0.
void fuzz_handshake(bool acceptor, uint8_t options, const uint8_t* data, size_t size) {
  const bool real_secret = (options & 1) == 0;
  const std::string& secret = real_secret ? kSecret : kOtherSecret;
  Handshake hs(acceptor ? HandshakeRole::kAcceptor : HandshakeRole::kConnector, secret, kCommId, acceptor ? 0 : 1,
               kWorld, acceptor ? -1 : 0, kNonce);
  const size_t chunk = 1 + ((options >> 1) & 63);  // 1..64 bytes per feed
  size_t offset = 0;
  while (offset < size) {
    if (hs.output_size() > sizeof(Hello) + sizeof(Proof)) violated("handshake output larger than a Hello and a Proof");
    hs.sent(hs.output_size());
    size_t n = std::min(chunk, size - offset);
    size_t taken = hs.feed(data + offset, n);
    if (taken > n) violated("feed() took more than it was given");
    if (taken == 0) break;  // finished or failed: the driver would stop reading here
    offset += taken;
  }
  switch (hs.state()) {
    case Handshake::State::kFailed:
      if (hs.error().empty()) violated("failed handshake without a reason");
      if (hs.wants() != 0) violated("failed handshake wants more bytes");
      break;
    case Handshake::State::kDone:
      if (!real_secret) violated("handshake succeeded with a secret the peer cannot know");
      if (acceptor && hs.peer_rank() != 1) violated("acceptor accepted an impossible rank");
      if (!acceptor && hs.peer_rank() != 0) violated("connector accepted the wrong rank");
      break;
    case Handshake::State::kRunning:
      if (hs.wants() == 0 && hs.output_size() == 0) violated("running handshake that neither reads nor writes");
      break;
  }
}

// Mode 2: pure header checks over every 64-byte window.
void fuzz_headers(const uint8_t* data, size_t size) {
  for (size_t at = 0; at + sizeof(FrameHeader) <= size; at += 8) {
    FrameHeader h, expected;
    std::memcpy(&h, data + at, sizeof(h));
    std::string bad = check_frame_header(h, kCommId, 1, kMaxMessage);
    if (bad.empty() && h.length > kMaxMessage && h.channel != static_cast<uint8_t>(Channel::kControl))
      violated("an oversized frame passed the header check");
    if (bad.empty() && h.channel == static_cast<uint8_t>(Channel::kControl) && h.length > kMaxControlPayload)
      violated("an oversized control frame passed the header check");
    (void)describe(h);
    if (at + 2 * sizeof(FrameHeader) <= size) {
      std::memcpy(&expected, data + at + sizeof(FrameHeader), sizeof(expected));
      (void)compare_headers(expected, h, 0);
    }
  }
}

FrameHeader collective(uint64_t seq, uint64_t count) {
  FrameHeader h;
  h.channel = static_cast<uint8_t>(Channel::kCollective);
  h.kind = static_cast<uint8_t>(CollectiveKind::kAllreduce);
  h.seq = seq;
  h.dtype = static_cast<uint8_t>(DataType::kFloat32);
  h.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  h.count = count;
  h.length = count * 4;
  h.src_rank = 1;
  h.comm_id = kCommId;
  return h;
}

// As rank 1 sends it (payload length, sender and communicator filled in).
FrameHeader p2p(uint64_t tag, uint64_t count) {
  FrameHeader h = mccl_test::p2p_header(tag, count);
  h.length = count;
  h.src_rank = 1;
  h.comm_id = kCommId;
  return h;
}

// Mode 3: rank 1's bytes into rank 0's Transport, which has a collective receive (seq 0, 16 floats)
// and a p2p receive (tag 7, 16 bytes) posted before, and a p2p receive (tag 9, 32 bytes) posted after
// the stream ended (so it may match an unexpected frame).
void fuzz_transport(uint8_t options, const uint8_t* data, size_t size) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return;
  std::vector<Socket> peers(kWorld);
  peers[1] = Socket(fds[0]);
  peers[1].configure_for_data(0);
  Transport t(0, kWorld, kCommId, std::move(peers), {"10.0.0.1:1", "10.0.0.2:2"}, kMaxMessage);
  // Declared after the Transport, so it closes first: the Transport's drain at close then sees the end of
  // the stream at once, as it would from a real peer that exits.
  Socket peer_end(fds[1]);
  peer_end.set_nonblocking();
  std::vector<char> coll(64), tag7(16), tag9(32);
  auto check = [](const Error& e) {
    // A peer's abort frame legitimately hands over its own error kind; anything else must be one of these.
    const bool adopted = std::strstr(e.what(), "[reported by rank 1 ") != nullptr;
    if (!adopted && e.kind() != Error::Kind::kProtocol && e.kind() != Error::Kind::kMismatch &&
        e.kind() != Error::Kind::kConnection)
    {
      std::fprintf(stderr, "fuzz_wire: error of kind %s: %s\n", Error::kind_name(e.kind()), e.what());
      violated("a peer's bytes caused an error other than protocol / mismatch / connection");
    }
  };
  try {
    FrameHeader expect = collective(0, 16);
    expect.src_rank = 0;
    t.post_recv(1, expect, coll.data(), coll.size());
    t.post_recv(1, p2p(7, 16), tag7.data(), tag7.size());
    // Write what fits (a socket pair holds far more than the fuzzer's inputs), then maybe close.
    size_t offset = 0;
    for (int round = 0; round < 256 && offset < size; ++round) {
      iovec iov{const_cast<uint8_t*>(data + offset), size - offset};
      offset += peer_end.send_some(&iov, 1);
      t.progress(0);
    }
    if (options & 1) peer_end.shutdown();
    for (int round = 0; round < 8; ++round) t.progress(0);
    auto late = t.post_recv(1, p2p(9, 32), tag9.data(), tag9.size());
    if (late->done && late->source != 1) violated("a receive completed from a rank that did not send");
    for (int round = 0; round < 4; ++round) t.progress(0);
  } catch (const Error& e) {
    check(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const uint8_t options = selector >> 2;
  data += 1;
  size -= 1;
  switch (selector & 3) {
    case 0: fuzz_handshake(true, options, data, size); break;
    case 1: fuzz_handshake(false, options, data, size); break;
    case 2: fuzz_headers(data, size); break;
    case 3: fuzz_transport(options, data, size); break;
  }
  return 0;
}

namespace mccl_fuzz {
namespace {

std::string bytes_of(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

std::string frame(const FrameHeader& h, const std::string& payload) { return bytes_of(&h, sizeof(h)) + payload; }

// What each end of a successful handshake (fixed nonces, the fuzzing secret) receives from the other.
void recorded_handshake(std::string* to_acceptor, std::string* to_connector) {
  const uint8_t other_nonce[kNonceBytes] = {0x11, 0x22, 0x33};
  // The acceptor under test uses kNonce; the connector that talks to it can use any nonce.
  Handshake connector(HandshakeRole::kConnector, kSecret, kCommId, 1, kWorld, 0, other_nonce);
  Handshake acceptor(HandshakeRole::kAcceptor, kSecret, kCommId, 0, kWorld, -1, kNonce);
  for (int round = 0; round < 8; ++round) {
    if (connector.output_size() > 0) {
      *to_acceptor += bytes_of(connector.output(), connector.output_size());
      connector.sent(acceptor.feed(connector.output(), connector.output_size()));
    }
    if (acceptor.output_size() > 0) {
      acceptor.sent(connector.feed(acceptor.output(), acceptor.output_size()));
    }
  }
  // The connector under test uses kNonce too: record what an acceptor would send it.
  Handshake c2(HandshakeRole::kConnector, kSecret, kCommId, 1, kWorld, 0, kNonce);
  Handshake a2(HandshakeRole::kAcceptor, kSecret, kCommId, 0, kWorld, -1, other_nonce);
  for (int round = 0; round < 8; ++round) {
    if (c2.output_size() > 0) c2.sent(a2.feed(c2.output(), c2.output_size()));
    if (a2.output_size() > 0) {
      *to_connector += bytes_of(a2.output(), a2.output_size());
      a2.sent(c2.feed(a2.output(), a2.output_size()));
    }
  }
}

}  // namespace

std::vector<std::string> seeds() {
  std::vector<std::string> out;
  std::string to_acceptor, to_connector;
  recorded_handshake(&to_acceptor, &to_connector);
  for (uint8_t options : {0, 1, 2, 63}) {
    out.push_back(std::string(1, char(0 | (options << 2))) + to_acceptor);
    out.push_back(std::string(1, char(1 | (options << 2))) + to_connector);
  }
  Hello old;
  old.version = 1;
  out.push_back(std::string(1, char(0)) + bytes_of(&old, 24));
  out.push_back(std::string(1, char(0)) + "GET / HTTP/1.1\r\n\r\n");

  FrameHeader heartbeat;
  heartbeat.channel = static_cast<uint8_t>(Channel::kControl);
  heartbeat.kind = static_cast<uint8_t>(ControlKind::kHeartbeat);
  heartbeat.comm_id = kCommId;
  heartbeat.src_rank = 1;
  FrameHeader abort_frame = heartbeat;
  abort_frame.kind = static_cast<uint8_t>(ControlKind::kAbort);
  abort_frame.count = static_cast<uint64_t>(Error::Kind::kTimeout);
  abort_frame.length = 12;
  const std::string floats(64, '\x01'), small(16, 'x'), unexpected(32, 'u');
  const std::string stream = frame(heartbeat, "") + frame(p2p(9, 32), unexpected) + frame(collective(0, 16), floats) +
                             frame(p2p(7, 16), small) + frame(heartbeat, "");
  for (uint8_t options : {0, 1}) {
    out.push_back(std::string(1, char(3 | (options << 2))) + stream);
    out.push_back(std::string(1, char(3 | (options << 2))) + frame(abort_frame, "peer failed!"));
    // An abort text with NUL and control bytes (an early finding: it cut the adopted message short).
    out.push_back(std::string(1, char(3 | (options << 2))) + frame(abort_frame, std::string("\x01\0\x1b[2Jfail\0!!", 12)));
    out.push_back(std::string(1, char(3 | (options << 2))) + frame(collective(0, 15), std::string(60, '\x02')));
    out.push_back(std::string(1, char(3 | (options << 2))) + frame(p2p(7, 16), small).substr(0, 70));
  }
  out.push_back(std::string(1, char(2)) + stream);
  return out;
}

}  // namespace mccl_fuzz
