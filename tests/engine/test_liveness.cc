// Liveness: heartbeats detect a peer that went silent without closing (stopped, asleep, unplugged),
// also between collectives; they never disturb data frames; a peer that dies is named with its address.
//
// Threads cannot be SIGSTOP'd on their own, so a "stopped" rank is a Transport nobody progresses: its
// socket stays open and says nothing, exactly what a stopped process looks like from the outside.
// tests/torch/test_liveness.py does the same with real processes and SIGSTOP.
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "frame_headers.h"
#include "local_world.h"
#include "transport/transport.h"

using namespace mccl;
using namespace std::chrono_literals;
using mccl_test::p2p_header;
using mccl_test::run_world;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::vector<std::string> kAddresses = {"10.0.0.1:5000", "10.0.0.4:5123"};

// Two transports of a 2-rank communicator joined by a socket pair.
struct PairOfTransports {
  std::unique_ptr<Transport> t[2];
  PairOfTransports(std::chrono::milliseconds interval, std::chrono::milliseconds timeout) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) fail(Error::Kind::kInternal, "socketpair failed");
    for (int r = 0; r < 2; ++r) {
      std::vector<Socket> peers(2);
      peers[1 - r] = Socket(fds[r]);
      peers[1 - r].configure_for_data(0);
      t[r] = std::make_unique<Transport>(r, 2, 77, std::move(peers), kAddresses, uint64_t(1) << 30);
      t[r]->set_heartbeat(interval, timeout);
    }
  }
};

// Progresses until `until` or an error; returns the error text ("" if none).
std::string progress_until(Transport& t, Clock::time_point until) {
  try {
    while (Clock::now() < until) t.progress(-1);  // -1: heartbeats bound the sleep
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(a_silent_peer_fails_within_the_heartbeat_timeout_while_idle) {
  // The silence counts from when the transports are made, so the clock starts before that.
  auto start = Clock::now();
  PairOfTransports pair(50ms, 400ms);
  // Rank 1 is "stopped": nobody progresses it. Rank 0 is idle (nothing posted) and must still notice.
  std::string error = progress_until(*pair.t[0], start + 5s);
  auto took = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK_MSG(contains(error, "heartbeat timeout") && contains(error, "rank 1 (10.0.0.4:5123)") &&
                contains(error, "heard nothing") && contains(error, "MCCL_HEARTBEAT_TIMEOUT=0.4) between collectives") &&
                contains(error, "stopped"),
            "%s", error.c_str());
  CHECK_MSG(took >= 0.4 && took < 1.5, "detected after %.2f s (timeout 0.4 s)", took);
  // The error is fatal and sticky, like every transport error.
  std::string again;
  try {
    pair.t[0]->progress(0);
  } catch (const Error& e) {
    again = e.what();
  }
  CHECK(again == error);
}

TEST(a_silent_peer_fails_a_pending_receive_naming_it) {
  PairOfTransports pair(50ms, 400ms);
  std::vector<char> buf(16);
  std::string error;
  auto start = Clock::now();
  try {
    auto r = pair.t[0]->post_recv(1, p2p_header(3, 16), buf.data(), buf.size());
    pair.t[0]->wait(r, start + 30s);  // the operation's own deadline is far away
  } catch (const Error& e) {
    error = e.what();
  }
  auto took = std::chrono::duration<double>(Clock::now() - start).count();
  CHECK_MSG(contains(error, "heartbeat timeout") && contains(error, "rank 1 (10.0.0.4:5123)"), "%s", error.c_str());
  CHECK_MSG(took < 1.5, "detected after %.2f s", took);
}

TEST(heartbeats_keep_idle_peers_alive_and_never_split_data_frames) {
  // Heartbeats due every few ms while an 8 MiB frame is only partly written (the receiver is late),
  // then a long idle stretch of several timeouts, then more data: all arrives intact, no error. The timeout
  // leaves room for a thread starved on a loaded machine (0.6 s was missed under ASan at ctest -j3 on 2 cores).
  const auto timeout = 1500ms;
  PairOfTransports pair(5ms, timeout);
  std::vector<uint8_t> big(8 << 20), got(8 << 20), small(100), small_got(100);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint8_t>(255 - i);
  std::string errors[2];
  const auto end = Clock::now() + 3 * timeout;
  std::thread sender([&] {
    try {
      auto r = pair.t[0]->post_send(1, p2p_header(1, big.size()), big.data(), big.size());
      pair.t[0]->wait(r, Clock::now() + 10s);
      errors[0] = progress_until(*pair.t[0], end - timeout / 2);
      if (!errors[0].empty()) return;
      auto s = pair.t[0]->post_send(1, p2p_header(2, small.size()), small.data(), small.size());
      pair.t[0]->wait(s, Clock::now() + 10s);
      errors[0] = progress_until(*pair.t[0], end);
    } catch (const Error& e) {
      errors[0] = e.what();
    }
  });
  try {
    std::this_thread::sleep_for(150ms);  // the sender's frame is stuck mid-way meanwhile
    auto r = pair.t[1]->post_recv(0, p2p_header(1, got.size()), got.data(), got.size());
    pair.t[1]->wait(r, Clock::now() + 10s);
    auto s = pair.t[1]->post_recv(0, p2p_header(2, small_got.size()), small_got.data(), small_got.size());
    pair.t[1]->wait(s, Clock::now() + 10s);
    errors[1] = progress_until(*pair.t[1], end);
  } catch (const Error& e) {
    errors[1] = e.what();
  }
  sender.join();
  CHECK_MSG(errors[0].empty() && errors[1].empty(), "rank 0: %s / rank 1: %s", errors[0].c_str(), errors[1].c_str());
  CHECK(got == big);
  CHECK(small_got == small);
}

TEST(a_large_frame_that_arrives_before_its_receive_is_kept_intact) {
  // Larger than the first piece of an unexpected frame's buffer (64 MiB), which grows as bytes arrive.
  PairOfTransports pair(1000ms, 30000ms);
  const size_t size = (80 << 20) + 123;
  std::vector<uint8_t> data(size), got(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  std::string sender_error, receiver_error;
  std::atomic<bool> sent{false};
  std::thread sender([&] {
    try {
      auto r = pair.t[0]->post_send(1, p2p_header(5, size), data.data(), size);
      pair.t[0]->wait(r, Clock::now() + 30s);
    } catch (const Error& e) {
      sender_error = e.what();
    }
    sent = true;
  });
  bool matched_at_once = false;
  try {
    while (!sent) pair.t[1]->progress(10);  // no receive posted: the frame goes to the unexpected list
    for (int i = 0; i < 5; ++i) pair.t[1]->progress(10);
    auto r = pair.t[1]->post_recv(0, p2p_header(5, size), got.data(), size);
    matched_at_once = r->done;
  } catch (const Error& e) {
    receiver_error = e.what();
  }
  sender.join();
  CHECK_MSG(sender_error.empty() && receiver_error.empty(), "%s / %s", sender_error.c_str(), receiver_error.c_str());
  CHECK(matched_at_once);
  CHECK(got == data);
}

TEST(heartbeat_timeout_zero_disables_detection) {
  PairOfTransports pair(10ms, 0ms);  // rank 1 silent for 600 ms, far beyond the 10 ms interval
  std::string bounded;
  try {
    for (int i = 0; i < 6; ++i) pair.t[0]->progress(100);
  } catch (const Error& e) {
    bounded = e.what();
  }
  CHECK_MSG(bounded.empty(), "%s", bounded.c_str());
}

TEST(a_peer_that_dies_is_named_with_its_address_at_once) {
  PairOfTransports pair(1000ms, 30000ms);
  std::vector<char> buf(16);
  std::string error;
  auto r = pair.t[0]->post_recv(1, p2p_header(3, 16), buf.data(), buf.size());
  pair.t[1].reset();  // the process is gone: its socket closes without an abort frame
  auto start = Clock::now();
  try {
    pair.t[0]->wait(r, start + 10s);
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK_MSG(contains(error, "lost its connection to rank 1 (10.0.0.4:5123)"), "%s", error.c_str());
  CHECK(Clock::now() - start < 1s);
}

TEST(communicators_stay_healthy_across_idle_time_with_heartbeats) {
  Config config = Config::global();
  config.heartbeat_interval = 20ms;
  config.heartbeat_timeout = 300ms;
  auto errors = run_world(3, [](int rank, Communicator& comm) {
    std::vector<double> buf(1000, rank + 1.0);
    comm.allreduce(buf.data(), buf.size(), DataType::kFloat64, ReduceOp::kSum)->wait();
    std::this_thread::sleep_for(1s);  // idle for more than three timeouts
    comm.allreduce(buf.data(), buf.size(), DataType::kFloat64, ReduceOp::kSum)->wait();
    for (double x : buf)
      if (x != 18.0) fail(Error::Kind::kInternal, "allreduce gave ", x);
  }, 10s, config);
  for (int r = 0; r < 3; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
}

TEST(heartbeat_settings_are_read_from_the_environment) {
  ::setenv("MCCL_HEARTBEAT_TIMEOUT", "2.5", 1);
  ::setenv("MCCL_HEARTBEAT_INTERVAL", "0.25", 1);
  Config c = Config::from_env();
  CHECK(c.heartbeat_timeout == 2500ms && c.heartbeat_interval == 250ms);
  ::setenv("MCCL_HEARTBEAT_TIMEOUT", "0", 1);
  CHECK(Config::from_env().heartbeat_timeout == 0ms);
  for (const char* bad : {"soon", "-1", "3s"}) {
    ::setenv("MCCL_HEARTBEAT_TIMEOUT", bad, 1);
    std::string error;
    try {
      Config::from_env();
    } catch (const Error& e) {
      error = e.what();
    }
    CHECK_MSG(contains(error, "MCCL_HEARTBEAT_TIMEOUT='") && contains(error, "seconds"), "%s: %s", bad, error.c_str());
  }
  ::unsetenv("MCCL_HEARTBEAT_TIMEOUT");
  ::setenv("MCCL_HEARTBEAT_INTERVAL", "0", 1);
  std::string error;
  try {
    Config::from_env();
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK_MSG(contains(error, "MCCL_HEARTBEAT_INTERVAL must be positive"), "%s", error.c_str());
  ::unsetenv("MCCL_HEARTBEAT_INTERVAL");
  CHECK(Config::from_env().heartbeat_timeout == 30s);
}

TEST(frame_headers_are_checked_before_anything_is_read) {
  FrameHeader h;
  h.comm_id = 77;
  h.src_rank = 1;
  h.channel = static_cast<uint8_t>(Channel::kControl);
  h.kind = static_cast<uint8_t>(ControlKind::kHeartbeat);
  CHECK(check_frame_header(h, 77, 1, 1024).empty());
  h.length = 1;
  CHECK(contains(check_frame_header(h, 77, 1, 1024), "heartbeat with a payload"));
  h.kind = 9;
  h.length = 0;
  CHECK(contains(check_frame_header(h, 77, 1, 1024), "unknown control frame kind 9"));
  h.kind = static_cast<uint8_t>(ControlKind::kAbort);
  h.length = kMaxControlPayload + 1;
  CHECK(contains(check_frame_header(h, 77, 1, 1024), "control frame of"));
  h.channel = 42;
  CHECK(contains(check_frame_header(h, 77, 1, 1024), "unknown channel 42"));
  h.channel = static_cast<uint8_t>(Channel::kCollective);
  h.length = 1025;
  CHECK(contains(check_frame_header(h, 77, 1, 1024), "exceeds MCCL_MAX_MESSAGE_BYTES=1024"));
  h.length = 10;
  CHECK(check_frame_header(h, 77, 1, 1024).empty());
  CHECK(contains(check_frame_header(h, 78, 1, 1024), "another communicator"));
  CHECK(contains(check_frame_header(h, 77, 0, 1024), "claims to come from rank 1"));
  h.version = 1;
  CHECK(contains(check_frame_header(h, 77, 1, 1024), "version 1"));
}

MCCL_TEST_MAIN
