// Authentication: SHA-256 / HMAC against published vectors, the handshake state machine, and
// rendezvous with foreign, silent and wrong-secret connections (logged and closed, never fatal).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.h"
#include "check.h"
#include "handshake.h"
#include "local_world.h"
#include "sha256.h"

using namespace mccl;
using mccl_test::run_world;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string hex(const Digest& d) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::string unhex(const std::string& text) {
  std::string out;
  for (size_t i = 0; i + 1 < text.size(); i += 2) out += static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16));
  return out;
}

std::string hmac_hex(const std::string& key, const std::string& data) {
  Bytes part{data.data(), data.size()};
  return hex(hmac_sha256(key.data(), key.size(), &part, 1));
}

// Redirects this process's stderr (where the engine logs) to a file while alive; text() reads it back.
class CaptureStderr {
 public:
  CaptureStderr() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    std::snprintf(path_, sizeof(path_), "/tmp/mccl_test_auth_XXXXXX");
    int fd = ::mkstemp(path_);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CaptureStderr() {
    restore();
    ::unlink(path_);
  }
  std::string text() {
    restore();
    std::ifstream in(path_);
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  int saved_ = -1;
  char path_[64];
};

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

TEST(sha256_matches_fips_180_4_examples) {
  CHECK(hex(sha256("abc", 3)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(sha256("", 0)) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(hex(sha256(two_blocks.data(), two_blocks.size())) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces to exercise the block buffering.
  Sha256 h;
  std::string piece(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    size_t n = std::min(left, piece.size());
    h.update(piece.data(), n);
    left -= n;
  }
  CHECK(hex(h.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the padding boundary, against Python's hashlib.sha256(b"x" * n).
  const std::pair<size_t, const char*> boundary[] = {
      {55, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072"},
      {56, "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e"},
      {63, "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2"},
      {64, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"},
      {65, "9537c5fdf120482f7d58d25e9ed583f52c02b4e304ea814db1633ad565aed7e9"}};
  for (const auto& [n, expected] : boundary) {
    std::string x(n, 'x');
    CHECK_MSG(hex(sha256(x.data(), n)) == expected, "sha256 of %zu bytes", n);
  }
}

TEST(hmac_sha256_matches_rfc_4231) {
  // Test cases 1, 2, 3, 4, 6 and 7 of RFC 4231 (5 is a truncated output).
  CHECK(hmac_hex(std::string(20, '\x0b'), "Hi There") ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hmac_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hmac_hex(std::string(20, '\xaa'), std::string(50, '\xdd')) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  CHECK(hmac_hex(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd')) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  CHECK(hmac_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First") ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(hmac_hex(std::string(131, '\xaa'),
                 "This is a test using a larger than block-size key and a larger than block-size data. The key "
                 "needs to be hashed before being used by the HMAC algorithm.") ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // The parts are concatenated.
  std::string key = "Jefe";
  Bytes parts[] = {{"what do ya ", 11}, {"want for nothing?", 17}};
  CHECK(hex(hmac_sha256(key.data(), key.size(), parts, 2)) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(constant_time_equal("abcd", "abcd", 4));
  CHECK(!constant_time_equal("abcd", "abce", 4));
}

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

TEST(communicators_with_a_shared_user_secret_work) {
  Config config = Config::global();
  config.auth_secret = "a-user-provided-secret-of-32-chars";
  config.auth_secret_source = "MCCL_AUTH_SECRET";
  auto errors = run_world(3, [](int rank, Communicator& comm) {
    std::vector<float> buf(5, float(rank + 1));
    comm.allreduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    for (float x : buf)
      if (x != 6.0f) fail(Error::Kind::kInternal, "allreduce gave ", x);
  }, std::chrono::seconds(10), config);
  for (int r = 0; r < 3; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
}

// Threads as ranks where each rank has its own Config.
std::vector<std::string> connect_with(const std::vector<Config>& configs, std::chrono::milliseconds timeout) {
  mccl_test::MemoryStore store(timeout);
  int world = static_cast<int>(configs.size());
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        connect_mesh(store, rank, world, "127.0.0.1", Clock::now() + timeout, configs[rank]);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(different_user_secrets_fail_with_a_clear_message) {
  Config a = Config::global(), b = Config::global();
  a.auth_secret = "the-secret-on-host-a-0123456789";
  b.auth_secret = "the-secret-on-host-b-0123456789";
  a.auth_secret_source = b.auth_secret_source = "MCCL_AUTH_SECRET";
  CaptureStderr capture;
  auto errors = connect_with({a, b}, std::chrono::milliseconds(800));
  std::string log = capture.text();
  // rank 1 (the connector) is told it was rejected and why that usually happens
  CHECK_MSG(contains(errors[1], "rank 0 at 127.0.0.1") && contains(errors[1], "rejected this rank") &&
                contains(errors[1], "MCCL_AUTH_SECRET"),
            "%s", errors[1].c_str());
  // rank 0 logged the failed proof with the remote address, and times out naming the missing rank
  CHECK_MSG(contains(log, "closed a connection from 127.0.0.1") && contains(log, "it said it is rank 1") &&
                contains(log, "failed authentication"),
            "%s", log.c_str());
  CHECK_MSG(contains(errors[0], "waiting for rank(s) 1") && contains(errors[0], "1 connection(s) were rejected"), "%s",
            errors[0].c_str());
}

TEST(a_secret_on_some_hosts_only_is_named) {
  Config with = Config::global(), without = Config::global();
  with.auth_secret = "the-secret-on-host-a-0123456789";
  with.auth_secret_source = "MCCL_AUTH_SECRET_FILE=/etc/mccl";
  without.auth_secret.clear();
  auto errors = connect_with({with, without}, std::chrono::milliseconds(500));
  CHECK_MSG(contains(errors[1], "rank 0 authenticates connections with its MCCL_AUTH_SECRET") &&
                contains(errors[1], "rank 1 has neither"),
            "%s", errors[1].c_str());
  errors = connect_with({without, with}, std::chrono::milliseconds(500));
  CHECK_MSG(contains(errors[1], "rank 1 has MCCL_AUTH_SECRET_FILE=/etc/mccl set, but rank 0 has no"), "%s",
            errors[1].c_str());
}

TEST(the_secret_is_read_from_the_environment_or_a_file) {
  char path[] = "/tmp/mccl_secret_XXXXXX";
  int fd = ::mkstemp(path);
  const char contents[] = "a-secret-from-a-file-0123456789\n";
  CHECK(::write(fd, contents, sizeof(contents) - 1) == ssize_t(sizeof(contents) - 1));
  ::close(fd);
  ::setenv("MCCL_AUTH_SECRET_FILE", path, 1);
  Config c = Config::from_env();
  CHECK(c.auth_secret == "a-secret-from-a-file-0123456789");  // the trailing newline is not part of it
  CHECK(contains(c.auth_secret_source, path));
  auto error_of = [] {
    try {
      Config::from_env();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ::setenv("MCCL_AUTH_SECRET", "another-secret-0123456789", 1);
  CHECK(contains(error_of(), "set only one"));
  ::unsetenv("MCCL_AUTH_SECRET_FILE");
  CHECK(Config::from_env().auth_secret == "another-secret-0123456789");
  ::setenv("MCCL_AUTH_SECRET", "short", 1);
  CHECK(contains(error_of(), "MCCL_AUTH_SECRET holds a secret of 5 bytes"));
  ::unsetenv("MCCL_AUTH_SECRET");
  ::setenv("MCCL_AUTH_SECRET_FILE", "/nonexistent/mccl-secret", 1);
  CHECK(contains(error_of(), "cannot be read"));
  ::unsetenv("MCCL_AUTH_SECRET_FILE");
  ::unlink(path);
  CHECK(Config::from_env().auth_secret.empty());
}

// Rank 0 accepts while strangers connect: garbage, a wrong secret, and more silent connections than it
// handles at once. The real rank 1 still gets in at once, and the port is closed afterwards.
TEST(foreign_connections_are_logged_closed_and_never_fatal) {
  mccl_test::MemoryStore store(std::chrono::seconds(10));
  store.set("mccl/addr/1", "127.0.0.1:9");  // so rank 0 goes straight to accepting
  CaptureStderr capture;
  std::string errors[2];
  Mesh meshes[2];
  const Config& config = Config::global();
  auto deadline = Clock::now() + std::chrono::seconds(10);
  std::thread rank0([&] {
    try {
      meshes[0] = connect_mesh(store, 0, 2, "127.0.0.1", deadline, config);
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
  });
  const std::string address = store.get("mccl/addr/0");
  const uint64_t comm_id = std::stoull(store.get("mccl/comm_id"));
  const auto addr = parse_address(address);
  const auto io_deadline = Clock::now() + std::chrono::seconds(5);

  Socket garbage = Socket::connect_to(addr, io_deadline, "rank 0");
  garbage.write_all("GET / HTTP/1.1\r\n\r\n", 18, io_deadline, "rank 0");

  // A client that knows the job's communicator id but not its secret: gets rank 0's challenge, fails.
  Socket impostor = Socket::connect_to(addr, io_deadline, "rank 0");
  Handshake hs(HandshakeRole::kConnector, "not-the-job-secret-at-all", comm_id, 1, 2, 0, kNonceC, lane_spec(config));
  impostor.write_all(hs.output(), hs.output_size(), io_deadline, "rank 0");
  hs.sent(hs.output_size());
  uint8_t reply[sizeof(Hello)];
  impostor.read_all(reply, sizeof(reply), io_deadline, "rank 0");
  hs.feed(reply, sizeof(reply));
  impostor.write_all(hs.output(), hs.output_size(), io_deadline, "rank 0");
  std::string impostor_end;
  try {
    impostor.read_all(reply, sizeof(Proof), io_deadline, "rank 0");
  } catch (const Error& e) {
    impostor_end = e.what();
  }
  CHECK_MSG(contains(impostor_end, "closed"), "the impostor got: '%s'", impostor_end.c_str());

  std::vector<Socket> silent;
  for (int i = 0; i < 80; ++i) silent.push_back(Socket::connect_to(addr, io_deadline, "rank 0"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));

  auto start = Clock::now();
  try {
    meshes[1] = connect_mesh(store, 1, 2, "127.0.0.1", deadline, config);
  } catch (const std::exception& e) {
    errors[1] = e.what();
  }
  rank0.join();
  auto took = Clock::now() - start;
  std::string log = capture.text();
  CHECK_MSG(errors[0].empty() && errors[1].empty(), "rank 0: %s / rank 1: %s", errors[0].c_str(), errors[1].c_str());
  CHECK(took < std::chrono::seconds(3));  // silent connections did not hold the real one up
  CHECK(meshes[0].peers[1].valid() && meshes[1].peers[0].valid());
  CHECK_MSG(contains(log, "bad magic") && contains(log, "failed authentication") &&
                contains(log, "too many connections were handshaking at once") &&
                contains(log, "more unauthenticated connection(s)"),
            "%s", log.c_str());
  // The listener is gone once rendezvous is over: nothing can connect to a running job.
  std::string late;
  try {
    Socket::connect_to(addr, Clock::now() + std::chrono::milliseconds(100), "rank 0");
  } catch (const Error& e) {
    late = e.what();
  }
  CHECK_MSG(contains(late, "could not connect"), "a connection after rendezvous got: '%s'", late.c_str());
}

MCCL_TEST_MAIN
