// Lanes below matching (transport/peer.h): over three connections per peer, a frame's payload is split
// into shares that both ends compute from its header; frames of every size arrive whole, in order per
// key, whether their receive was posted before, after, or while their bytes were arriving, with or
// without the sender threads; bytes on a lane that are not the share due there are a protocol error; and a
// peer whose lane 0 ends before its other lanes' shares are read has still sent the whole frame.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "frame_headers.h"
#include "transport/transport.h"

using namespace mccl;
using namespace std::chrono_literals;
using mccl_test::p2p_header;

namespace {

constexpr int kLanes = 3;
constexpr uint64_t kCommId = 77;
const std::vector<std::string> kAddresses = {"10.0.0.1:5000", "10.0.0.4:5123"};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Socket pairs for the kLanes connections between rank 0 and rank 1: fds[lane][rank].
struct Wires {
  int fds[kLanes][2];
  Wires() {
    for (auto& pair : fds) {
      if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) fail(Error::Kind::kInternal, "socketpair failed");
    }
  }
  std::vector<Socket> ends_of(int rank) {
    std::vector<Socket> peers(2 * kLanes);
    for (int lane = 0; lane < kLanes; ++lane) {
      Socket& s = peers[(1 - rank) * kLanes + lane];
      s = Socket(fds[lane][rank]);
      s.configure_for_data(0);
    }
    return peers;
  }
};

std::vector<char> pattern(size_t size, int seed) {
  std::vector<char> v(size);
  for (size_t i = 0; i < size; ++i) v[i] = static_cast<char>((i * 131 + static_cast<size_t>(seed) * 7) >> 3);
  return v;
}

// The header of a frame from rank 1, for tests that write its lanes by hand (its shares' heads: lane_header).
FrameHeader from_rank_1(uint64_t tag, uint64_t length) {
  FrameHeader h = p2p_header(tag);
  h.comm_id = kCommId;
  h.src_rank = 1;
  h.length = length;
  return h;
}

void progress_both(Transport& a, Transport& b, const std::vector<RequestPtr>& until, Deadline deadline) {
  auto all_done = [&] {
    for (const auto& r : until) {
      if (!r->done) return false;
    }
    return true;
  };
  while (!all_done()) {
    CHECK(Clock::now() < deadline);
    if (Clock::now() >= deadline) return;
    a.progress(0);
    b.progress(0);
  }
}

void frames_of_every_size(bool sender_thread) {
  Wires wires;
  Transport t0(0, 2, kCommId, wires.ends_of(0), kAddresses, uint64_t(1) << 30, kLanes);
  Transport t1(1, 2, kCommId, wires.ends_of(1), kAddresses, uint64_t(1) << 30, kLanes);
  if (sender_thread) t1.set_send_thread(1);
  const size_t sizes[] = {0, 1, kMinShareBytes - 1, kMinShareBytes, 2 * kMinShareBytes + 5, 40000, (1 << 20) + 3,
                          (3 << 20) + 7, 100, 0, 65536};
  const int n = static_cast<int>(sizeof(sizes) / sizeof(sizes[0]));
  std::vector<std::vector<char>> sent, got;
  for (int k = 0; k < n; ++k) sent.push_back(pattern(sizes[k], k)), got.emplace_back(sizes[k], '\0');
  std::vector<RequestPtr> requests;
  // Even tags are posted before anything is sent, odd ones after everything arrived (unexpected) or while
  // it arrives; the 3 MiB frame is larger than the socket buffers, so its receive meets it mid-way.
  for (int k = 0; k < n; k += 2) requests.push_back(t0.post_recv(1, p2p_header(k), got[k].data(), sizes[k]));
  for (int k = 0; k < n; ++k) requests.push_back(t1.post_send(0, p2p_header(k), sent[k].data(), sizes[k]));
  for (int round = 0; round < 4; ++round) t0.progress(0), t1.progress(0);
  for (int k = 1; k < n; k += 2) requests.push_back(t0.post_recv(1, p2p_header(k), got[k].data(), sizes[k]));
  progress_both(t0, t1, requests, Clock::now() + 20s);
  for (int k = 0; k < n; ++k) CHECK_MSG(got[k] == sent[k], "frame %d (%zu bytes) differs", k, sizes[k]);
}

}  // namespace

TEST(shares_cover_the_payload_from_lane_0_and_keep_small_frames_whole) {
  FrameHeader h = p2p_header(0);
  for (uint64_t length : {uint64_t(0), uint64_t(1), kMinShareBytes - 1, 2 * kMinShareBytes, uint64_t(1) << 20,
                          (uint64_t(3) << 20) + 7}) {
    h.length = length;
    uint64_t covered = 0;
    int used = 0;
    for (int lane = 0; lane < kLanes; ++lane) {
      const Span s = lane_span(h, kLanes, lane);
      CHECK(s.begin == covered || s.size() == 0);
      covered += s.size();
      used += s.size() > 0;
    }
    CHECK_MSG(covered == length, "length %llu: shares cover %llu", (unsigned long long)length, (unsigned long long)covered);
    CHECK(length >= kLanes * kMinShareBytes ? used == kLanes : length < kMinShareBytes ? used <= 1 : used >= 1);
  }
  h.channel = static_cast<uint8_t>(Channel::kControl);
  h.length = 60000;
  CHECK(lane_span(h, kLanes, 0).size() == 60000);  // control frames are never split
}

TEST(frames_of_every_size_arrive_whole_over_three_lanes) { frames_of_every_size(false); }

TEST(the_same_through_the_sender_threads) { frames_of_every_size(true); }

TEST(frames_with_the_same_key_match_in_order) {
  Wires wires;
  Transport t0(0, 2, kCommId, wires.ends_of(0), kAddresses, uint64_t(1) << 30, kLanes);
  Transport t1(1, 2, kCommId, wires.ends_of(1), kAddresses, uint64_t(1) << 30, kLanes);
  constexpr int kFrames = 6;
  const size_t size = 300000;
  std::vector<std::vector<char>> sent, got;
  std::vector<RequestPtr> requests;
  for (int k = 0; k < kFrames; ++k) sent.push_back(pattern(size, k + 1)), got.emplace_back(size, '\0');
  for (int k = 0; k < kFrames; ++k) requests.push_back(t1.post_send(0, p2p_header(9), sent[k].data(), size));
  for (int k = 0; k < kFrames; ++k) {
    t0.progress(0), t1.progress(0);
    requests.push_back(t0.post_recv(k % 2 ? kAnySource : 1, p2p_header(9), got[k].data(), size));
  }
  progress_both(t0, t1, requests, Clock::now() + 20s);
  for (int k = 0; k < kFrames; ++k) CHECK_MSG(got[k] == sent[k], "receive %d got another frame's bytes", k);
}

TEST(bytes_that_are_not_the_share_due_on_a_lane_are_a_protocol_error) {
  for (int variant = 0; variant < 2; ++variant) {
    Wires wires;
    Transport t0(0, 2, kCommId, wires.ends_of(0), kAddresses, uint64_t(1) << 30, kLanes);
    std::vector<Socket> raw = wires.ends_of(1);  // rank 1, written by hand
    const FrameHeader h = from_rank_1(5, 3 * kMinShareBytes);
    std::vector<char> payload = pattern(h.length, 3), got(h.length);
    RequestPtr r = t0.post_recv(1, p2p_header(5), got.data(), got.size());
    const Span first = lane_span(h, kLanes, 0), second = lane_span(h, kLanes, 1);
    const Deadline deadline = Clock::now() + 5s;
    raw[0].write_all(&h, sizeof(h), deadline, "lane 0");
    raw[0].write_all(payload.data(), first.size(), deadline, "lane 0");
    LaneHeader lh = lane_header(h, 1, variant == 0 ? second.begin + 64 : second.begin);  // the wrong share, or garbage
    if (variant == 1) lh.magic = 0x20544547;                      // "GET "
    raw[1].write_all(&lh, sizeof(lh), deadline, "lane 1");
    raw[1].write_all(payload.data() + second.begin, second.size(), deadline, "lane 1");
    std::string error;
    try {
      t0.wait(r, Clock::now() + 5s);
    } catch (const Error& e) {
      CHECK(e.kind() == Error::Kind::kProtocol);
      error = e.what();
    }
    CHECK_MSG(contains(error, "rank 1 (10.0.0.4:5123)") && contains(error, "lane 1 is out of step") &&
                  contains(error, variant == 0 ? "offset" : "magic"),
              "%s", error.c_str());
  }
}

// Each lane is a TCP stream of its own, so a peer that sent a frame and closed can have its end of stream
// on lane 0 read before the shares on lanes 1 and 2: the frame still arrives whole, and only then is the
// peer closed (4 ranks over 3 lanes on 2 loaded cores failed about one run in six before).
TEST(a_peer_whose_lane_0_ends_before_its_shares_arrive_has_sent_the_whole_frame) {
  Wires wires;
  Transport t0(0, 2, kCommId, wires.ends_of(0), kAddresses, uint64_t(1) << 30, kLanes);
  std::vector<Socket> raw = wires.ends_of(1);  // rank 1, written by hand
  const FrameHeader h = from_rank_1(6, 3 * kMinShareBytes + 5);
  std::vector<char> payload = pattern(h.length, 4), got(h.length);
  RequestPtr r = t0.post_recv(1, p2p_header(6), got.data(), got.size());
  const Deadline deadline = Clock::now() + 5s;
  const Span first = lane_span(h, kLanes, 0);
  raw[0].write_all(&h, sizeof(h), deadline, "lane 0");
  raw[0].write_all(payload.data(), first.size(), deadline, "lane 0");
  raw[0].shutdown_write();
  for (int round = 0; round < 5; ++round) t0.progress(0);  // lane 0: its share, then its end of stream
  CHECK(!r->done);
  for (int lane = 1; lane < kLanes; ++lane) {
    const Span share = lane_span(h, kLanes, lane);
    const LaneHeader lh = lane_header(h, lane, share.begin);
    raw[lane].write_all(&lh, sizeof(lh), deadline, "lane");
    raw[lane].write_all(payload.data() + share.begin, share.size(), deadline, "lane");
    raw[lane].shutdown_write();
  }
  std::string error;
  try {
    t0.wait(r, Clock::now() + 5s);
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK_MSG(error.empty(), "%s", error.c_str());
  CHECK(got == payload);
  std::vector<char> more(8);  // the peer is gone now: what still needs it fails, naming it
  error.clear();
  try {
    t0.wait(t0.post_recv(1, p2p_header(7), more.data(), more.size()), Clock::now() + 5s);
  } catch (const Error& e) {
    error = e.what();
  }
  CHECK_MSG(contains(error, "lost its connection to rank 1 (10.0.0.4:5123)"), "%s", error.c_str());
}

MCCL_TEST_MAIN
