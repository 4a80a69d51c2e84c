// Authentication at rendezvous: communicators with a shared secret, different secrets, a secret on some
// hosts only, the secret from the environment or a file, and foreign, silent and wrong-secret connections
// (logged and closed, never fatal). The hashes and the handshake itself: test_sha256.cc, test_handshake.cc.
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

const uint8_t kNonceC[kNonceBytes] = {9, 8, 7};

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

}  // namespace


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
