// The sender thread (MCCL_SEND_THREAD_BYTES) on its own, over a socketpair: frames arrive whole and in
// order, finished frames are counted, a closed peer is reported, and stop() mid-frame says exactly how
// much went out. Collectives through it run in test_collectives / test_failures under
// MCCL_SEND_THREAD_BYTES=1 (see CMakeLists.txt); the last test here also runs them with it on.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "local_world.h"
#include "transport/sender.h"
#include "transport/transport.h"

using namespace mccl;
using mccl_test::run_world;

namespace {

struct Pipe {
  int writer = -1, reader = -1;
  Pipe() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) fail(Error::Kind::kInternal, "socketpair failed");
    writer = fds[0];
    reader = fds[1];
    fcntl(writer, F_SETFL, fcntl(writer, F_GETFL, 0) | O_NONBLOCK);
  }
  ~Pipe() {
    if (writer >= 0) ::close(writer);
    if (reader >= 0) ::close(reader);
  }
};

FrameCursor frame(std::vector<char>& payload, uint32_t step) {
  auto r = std::make_shared<Request>();
  r->header.step = step;
  r->header.length = payload.size();
  r->data = payload.data();
  r->length = payload.size();
  return whole_frame(r);
}

bool read_exactly(int fd, void* data, size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Collects until `frames` are reported for slot 0 or `limit` passes; returns the report.
Sender::Report wait_for(Sender& sender, size_t frames, std::chrono::milliseconds limit) {
  std::vector<Sender::Report> reports;
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    sender.collect(&reports);
    if (reports[0].finished >= frames || !reports[0].error.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return reports[0];
}

}  // namespace

TEST(frames_arrive_whole_and_in_order) {
  Pipe pipe;
  std::atomic<int> notified{0};
  Sender sender(1, [&] { ++notified; }, /*adaptive_spin=*/true, std::chrono::microseconds(0));
  std::mt19937 rng(7);
  constexpr int kFrames = 24;
  std::vector<std::vector<char>> payloads(kFrames);
  for (int k = 0; k < kFrames; ++k) {
    payloads[k].resize(k % 5 == 0 ? 0 : rng() % (3 << 20));
    for (size_t i = 0; i < payloads[k].size(); ++i) payloads[k][i] = static_cast<char>(i * 31 + k);
  }
  std::string problem;
  std::thread reader([&] {
    for (int k = 0; k < kFrames && problem.empty(); ++k) {
      FrameHeader h;
      std::vector<char> got;
      if (!read_exactly(pipe.reader, &h, sizeof(h))) problem = "header " + std::to_string(k) + " missing";
      else if (h.step != static_cast<uint32_t>(k) || h.length != payloads[k].size())
        problem = "frame " + std::to_string(k) + " out of order or resized";
      else if (got.resize(h.length), !read_exactly(pipe.reader, got.data(), got.size()) || got != payloads[k])
        problem = "payload " + std::to_string(k) + " differs";
    }
  });
  // Half the frames up front, the rest while the first ones are on the wire.
  std::vector<FrameCursor> requests;
  for (int k = 0; k < kFrames; ++k) {
    requests.push_back(frame(payloads[k], static_cast<uint32_t>(k)));
    if (k == kFrames / 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    sender.submit(0, pipe.writer, requests.back());
  }
  Sender::Report report = wait_for(sender, kFrames, std::chrono::seconds(20));
  reader.join();
  CHECK_MSG(problem.empty(), "%s", problem.c_str());
  CHECK_MSG(report.finished == kFrames && report.error.empty(), "finished %zu, error '%s'", report.finished,
            report.error.c_str());
  CHECK(notified.load() > 0);
  CHECK(!sender.has_news());
}

TEST(a_frame_already_partly_sent_continues_where_it_stopped) {
  Pipe pipe;
  Sender sender(1, [] {}, false, std::chrono::microseconds(0));
  std::vector<char> payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i);
  FrameCursor segment = frame(payload, 3);
  segment.progress = sizeof(FrameHeader) + 100;  // the progress thread wrote the header and 100 bytes
  sender.submit(0, pipe.writer, segment);
  std::vector<char> got(900);
  CHECK(read_exactly(pipe.reader, got.data(), got.size()));
  CHECK(std::memcmp(got.data(), payload.data() + 100, 900) == 0);
  CHECK(wait_for(sender, 1, std::chrono::seconds(5)).finished == 1);
}

TEST(a_closed_peer_is_reported_not_hung) {
  Pipe pipe;
  ::close(pipe.reader);
  pipe.reader = -1;
  Sender sender(1, [] {}, false, std::chrono::microseconds(0));
  std::vector<char> payload(1 << 20, 'x');
  sender.submit(0, pipe.writer, frame(payload, 0));
  Sender::Report report = wait_for(sender, 1, std::chrono::seconds(5));
  CHECK_MSG(report.finished == 0 && report.error.find("send failed") != std::string::npos, "finished %zu, error '%s'",
            report.finished, report.error.c_str());
}

TEST(stop_mid_frame_says_how_much_went_out) {
  Pipe pipe;
  Sender sender(1, [] {}, false, std::chrono::microseconds(0));
  std::vector<char> payload(size_t(64) << 20, 'y');  // far more than the socket buffer holds
  sender.submit(0, pipe.writer, frame(payload, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto start = std::chrono::steady_clock::now();
  std::vector<size_t> head;
  sender.stop(&head);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  CHECK_MSG(head.size() == 1 && head[0] > sizeof(FrameHeader) && head[0] < sizeof(FrameHeader) + payload.size(),
            "head progress %zu", head.empty() ? size_t(0) : head[0]);
  // Exactly that many bytes are in the socket: nothing more is written after stop().
  fcntl(pipe.reader, F_SETFL, fcntl(pipe.reader, F_GETFL, 0) | O_NONBLOCK);
  size_t available = 0;
  std::vector<char> sink(1 << 16);
  for (ssize_t n; (n = ::read(pipe.reader, sink.data(), sink.size())) > 0;) available += static_cast<size_t>(n);
  CHECK_MSG(available == head[0], "read %zu, reported %zu", available, head[0]);
}

// Through a Communicator: every frame of every collective goes through the sender (threshold 1 byte),
// results compared with a float64 reference computed here.
TEST(collectives_through_the_sender_match_float64) {
  Config config = Config::global();
  config.send_thread_bytes = 1;
  config.send_thread_auto = false;
  constexpr int kWorld = 4;
  const size_t count = (size_t(3) << 20) / 4 + 7;  // uneven ring segments, several pieces each
  auto value = [](int rank, size_t i) { return static_cast<float>((i * 7 + rank * 13) % 101) * 0.25f; };
  auto errors = run_world(kWorld, [&](int rank, Communicator& comm) {
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = value(rank, i);
    comm.allreduce(buf.data(), count, DataType::kFloat32, ReduceOp::kSum)->wait();
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int r = 0; r < kWorld; ++r) want += value(r, i);
      if (static_cast<double>(buf[i]) != want) fail(Error::Kind::kInternal, "allreduce element ", i, " is ", buf[i], " not ", want);
    }
    std::vector<float> mine(count, static_cast<float>(rank + 1));
    std::vector<std::vector<float>> outs(kWorld, std::vector<float>(count));
    std::vector<char*> out_ptrs;
    for (auto& o : outs) out_ptrs.push_back(reinterpret_cast<char*>(o.data()));
    comm.allgather(mine.data(), count, DataType::kFloat32, out_ptrs)->wait();
    for (int r = 0; r < kWorld; ++r) {
      if (outs[r][0] != r + 1 || outs[r][count - 1] != r + 1) fail(Error::Kind::kInternal, "allgather part ", r, " wrong");
    }
  }, std::chrono::seconds(60), config);
  for (int r = 0; r < kWorld; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
}

MCCL_TEST_MAIN
