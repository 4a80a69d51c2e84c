// A peer: everything this rank has with one other rank. Owned and run by the progress thread; a sender
// thread (sender.h) writes the segments a peer hands it, and nothing else of it.
//
// It holds the peer's MCCL_NSOCKS sockets ("lanes"), a send queue per lane, the read state of each lane,
// and the frames whose payload is still arriving. Lanes live here, below matching: a frame's header always
// travels on lane 0, and its payload is split into at most nsocks consecutive shares (lane_span), share k
// on lane k, each after a LaneHeader (wire.h) on lanes above 0. Both ends compute the shares from the
// header alone, and each lane is FIFO, so a lane's bytes are the shares of the frames in lane 0's order:
// when lane 0 reads a header, the matcher says where the payload goes, and each other lane is told which
// share comes next on it. A lane above 0 is read only while it has a share due, so matching never sees
// sockets. With one lane (the default), a frame is its header and payload, written in one sendmsg().
//
// Errors are thrown (Error); the transport makes them fatal and names the peer.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "error.h"
#include "socket.h"
#include "transport/frame_cursor.h"
#include "transport/matcher.h"
#include "transport/sender.h"

namespace mccl {

// The bytes [begin, end) of a frame's payload that one lane carries.
struct Span {
  uint64_t begin = 0, end = 0;
  uint64_t size() const { return end - begin; }
};
// Shares of at least kMinShareBytes (so small frames stay whole on lane 0), up to nsocks of them, lane 0
// first; control frames are never split.
constexpr uint64_t kMinShareBytes = uint64_t(16) << 10;
Span lane_span(const FrameHeader& h, int nsocks, int lane);
// The head of frame h's share on `lane` (above 0), which starts at byte `offset` of its payload.
LaneHeader lane_header(const FrameHeader& h, int lane, uint64_t offset);

// The sender threads of a transport, one per lane index (none: empty), and the frame size sent through them.
struct SendThreads {
  std::vector<std::unique_ptr<Sender>> by_lane;
  size_t min_bytes = 0;
  Sender* of(int lane) const { return by_lane.empty() ? nullptr : by_lane[lane].get(); }
};

class Peer {
 public:
  struct Context {
    int my_rank = 0;
    uint64_t comm_id = 0;
    uint64_t max_message_bytes = 0;
    Matcher* matcher = nullptr;
    const SendThreads* threads = nullptr;
  };
  Peer(int rank, std::string name, std::vector<Socket> lanes, const Context& context, Clock::time_point now);

  const std::string& name() const { return name_; }
  int lanes() const { return static_cast<int>(lanes_.size()); }
  int fd(int lane) const { return lanes_[lane].sock.fd(); }
  // The peer closed its end between frames, or sent an abort; closed_error() says which.
  bool closed() const { return closed_; }
  Error closed_error() const;
  Clock::time_point last_heard() const { return last_heard_; }
  Clock::time_point last_sent() const { return last_sent_; }

  // Queues a send (a segment per lane that carries a share of it) and writes what the sockets take.
  void post(const RequestPtr& request, Clock::time_point now);
  // Queues the peer's heartbeat if nothing else is queued.
  void heartbeat(Clock::time_point now);
  bool wants_write(int lane) const { return lanes_[lane].sendq.size() > lanes_[lane].offloaded; }
  bool wants_read(int lane) const;
  // Writes what the lane takes now; a large frame's segment, and all behind it, go to the lane's sender.
  void write(int lane, Clock::time_point now);
  // Reads what the lane has; headers are matched, finished frames delivered.
  void read(int lane, Clock::time_point now);
  // The lane's first n segments are written (by this thread or its sender): frames they finish complete.
  void retire(int lane, size_t n, Clock::time_point now);
  // After the lane's sender stopped: its first segment has `progress` bytes out, and it is ours again.
  void take_back(int lane, size_t progress);

  // The abort path, bounded: finishes each lane's half-written segment, then writes `abort` on lane 0.
  void write_abort(FrameCursor abort, Deadline deadline);
  void shutdown_write();
  // After a fatal error: every request it holds into *pending; its queues and read state are dropped.
  void drop_all(std::vector<RequestPtr>* pending);

 private:
  struct Frame {  // a frame whose header came and whose payload is still arriving
    FrameHeader header;
    RequestPtr target;      // the receive it matched, or
    bool stashed = false;   // an unexpected frame in the matcher (stash), or
    Matcher::Stash stash;
    bool control = false;   // a control frame (an abort), into control_
    int shares_left = 0;
  };
  using FrameIt = std::list<Frame>::iterator;
  struct Share {
    FrameIt frame;
    Span span;
  };
  struct Lane {
    Socket sock;
    std::deque<FrameCursor> sendq;
    size_t offloaded = 0;          // the first `offloaded` segments are the lane's sender's to write
    std::deque<Share> due;         // lanes above 0: the shares to come, in order
    alignas(8) char head[sizeof(FrameHeader)] = {};  // the head being read (FrameHeader / LaneHeader)
    size_t head_got = 0;
    alignas(8) char next[sizeof(FrameHeader)] = {};  // the next head, read with a share's last bytes
    bool in_share = false;
    Share share;                   // the share being read
    uint64_t got = 0;              // its bytes read
  };
  void hand_over(int lane);
  void on_frame_header();
  void start_share(int lane);
  void finish_share(const Share& share);
  void finish_frame(FrameIt frame);
  char* place(Frame& frame, uint64_t pos, uint64_t* room);
  void on_control(const FrameHeader& h);
  void on_end_of_stream(const Error& cause);
  void on_closed(const Error& cause);

  int rank_;
  std::string name_;
  Context context_;
  std::vector<Lane> lanes_;
  std::list<Frame> arriving_, spare_frames_;  // frames in flight, in header order; recycled list nodes
  std::vector<char> control_;                 // a control frame's payload
  RequestPtr heartbeat_;                      // reused; queued only when nothing else is
  bool closed_ = false;
  std::shared_ptr<Error> closed_cause_;       // the abort it reported, if any
  std::shared_ptr<Error> ended_;              // lane 0's end of stream, while shares are still arriving
  Clock::time_point last_heard_;              // when bytes last arrived (progress-round resolution)
  Clock::time_point last_sent_;               // when bytes last left
};

}  // namespace mccl
