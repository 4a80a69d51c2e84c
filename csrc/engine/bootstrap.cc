#include "bootstrap.h"

#include <poll.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>

#include "algorithms/select.h"
#include "entropy.h"
#include "error.h"
#include "handshake.h"
#include "listener.h"
#include "log.h"
#include "wire.h"

namespace mccl {
namespace {

// An accepted connection must complete its handshake within this; a legitimate peer needs a few round
// trips. Handshakes run concurrently, so a connection that sends nothing delays nobody else.
constexpr auto kHandshakeLimit = std::chrono::seconds(10);
// Unauthenticated connections handled at once; when more arrive, the oldest is dropped.
constexpr size_t kMaxPendingHandshakes = 64;
// Rejected connections logged one by one per rendezvous; the rest are counted.
constexpr int kMaxRejectionWarnings = 8;
constexpr size_t kSecretBytes = 32;
const char kAuthKey[] = "mccl/auth";

std::string store_get(Store& store, const std::string& key, int rank, const std::string& what) {
  try {
    return store.get(key);
  } catch (const Error& e) {
    fail(Error::Kind::kTimeout, "rank ", rank, " timed out in rendezvous waiting for ", what,
         " (did every rank call init_process_group with the same world size?): ", e.what());
  }
}

std::string hex(const uint8_t* bytes, size_t size) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return out;
}

std::string rejected_during_handshake(const std::string& what) {
  return what + " closed the connection during the handshake: it rejected this rank. Most likely "
         "MCCL_AUTH_SECRET / MCCL_AUTH_SECRET_FILE differ between the hosts, or they run different "
         "lightning-mccl versions; that rank's log names the reason";
}

// Connector side, one peer at a time: send, read exactly what the handshake wants, until it is done.
Socket connect_and_authenticate(Handshake& hs, const std::string& address, Deadline deadline, int rank,
                                const std::string& what) {
  Socket sock = Socket::connect_to(parse_address(address), deadline, what);
  uint8_t buf[sizeof(Hello)];
  try {
    while (hs.state() != Handshake::State::kFailed && !hs.finished()) {
      if (hs.output_size() > 0) {
        size_t n = hs.output_size();
        sock.write_all(hs.output(), n, deadline, what);
        hs.sent(n);
        continue;
      }
      size_t want = std::min(hs.wants(), sizeof(buf));
      if (want == 0) break;
      sock.read_all(buf, want, deadline, what);
      hs.feed(buf, want);
    }
  } catch (const Error& e) {
    if (e.kind() != Error::Kind::kConnection) throw;
    fail(Error::Kind::kConnection, "rank ", rank, ": ", rejected_during_handshake(what));
  }
  if (!hs.finished()) fail(Error::Kind::kProtocol, "rank ", rank, " rejected the connection to ", what, ": ", hs.error());
  return sock;
}

// Acceptor side: the listener and every connection still proving itself, in one poll() loop.
class Acceptor {
 public:
  Acceptor(Listener& listener, Mesh& mesh, const std::string& secret, int rank, int size, const LaneSpec& lanes)
      : listener_(listener), mesh_(mesh), secret_(secret), rank_(rank), size_(size), lanes_(lanes) {}

  void run(Deadline deadline) {
    while (missing() > 0) {
      const auto now = Clock::now();
      expire(now);
      if (now >= deadline) timed_out();
      std::vector<pollfd> fds;
      fds.push_back({listener_.fd(), POLLIN, 0});
      Deadline wake = deadline;
      for (auto& p : pending_) {
        short events = 0;
        if (p->hs.wants() > 0) events |= POLLIN;
        if (p->hs.output_size() > 0) events |= POLLOUT;
        fds.push_back({p->sock.fd(), events, 0});
        wake = std::min(wake, p->deadline);
      }
      int ready = ::poll(fds.data(), fds.size(), std::max(1, ms_until(wake, 1000)));
      if (ready < 0 && errno != EINTR) fail(Error::Kind::kInternal, "poll failed: ", std::strerror(errno));
      if (ready <= 0) continue;
      // Step the pending connections first (indexes match fds), then take new ones.
      std::vector<Incoming*> ready_ones;
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) ready_ones.push_back(pending_[i - 1].get());
      }
      for (Incoming* p : ready_ones) step(*p);
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& p) { return !p->sock.valid(); }),
                     pending_.end());
      if (fds[0].revents != 0) accept_all(now);
    }
    if (suppressed_ > 0)
      log(LogLevel::kWarn, "rank ", rank_, " closed ", suppressed_, " more unauthenticated connection(s) (not logged one by one)");
  }

 private:
  struct Incoming {
    Socket sock;
    std::string from;
    Deadline deadline;
    Handshake hs;
  };

  int missing() const {
    int n = 0;
    for (int i = (rank_ + 1) * mesh_.nsocks; i < size_ * mesh_.nsocks; ++i) n += mesh_.peers[i].valid() ? 0 : 1;
    return n;
  }

  void accept_all(Clock::time_point now) {
    while (true) {
      Socket sock = listener_.try_accept();
      if (!sock.valid()) return;
      if (pending_.size() >= kMaxPendingHandshakes) {
        reject(*pending_.front(), "too many connections were handshaking at once; this was the oldest");
        pending_.pop_front();
      }
      uint8_t nonce[kNonceBytes];
      random_bytes(nonce, sizeof(nonce));
      std::string from = format_address(sock.peer_address());
      pending_.push_back(std::unique_ptr<Incoming>(new Incoming{
          std::move(sock), from, now + kHandshakeLimit,
          Handshake(HandshakeRole::kAcceptor, secret_, mesh_.comm_id, rank_, size_, -1, nonce, lanes_)}));
    }
  }

  // Moves what the socket has and takes; ends the connection (accepted or rejected) when it can.
  void step(Incoming& p) {
    uint8_t buf[sizeof(Hello)];
    try {
      while (true) {
        if (p.hs.output_size() > 0) {
          iovec iov{const_cast<uint8_t*>(p.hs.output()), p.hs.output_size()};
          size_t n = p.sock.send_some(&iov, 1);
          p.hs.sent(n);
          if (n == 0) break;
          continue;
        }
        if (p.hs.state() != Handshake::State::kRunning) break;
        size_t n = p.sock.recv_some(buf, std::min(p.hs.wants(), sizeof(buf)));
        if (n == 0) break;
        p.hs.feed(buf, n);
      }
    } catch (const Error& e) {
      return reject(p, e.what());
    }
    if (p.hs.state() == Handshake::State::kFailed) return reject(p, p.hs.error());
    if (!p.hs.finished()) return;
    const int peer = p.hs.peer_rank(), lane = p.hs.peer_lane();
    Socket& slot = mesh_.peers[peer * mesh_.nsocks + lane];
    if (slot.valid()) return reject(p, "rank " + std::to_string(peer) + " connected twice (lane " + std::to_string(lane) + ")");
    log(LogLevel::kTrace, "rank ", rank_, " accepted rank ", peer, " lane ", lane, " from ", p.from);
    slot = std::move(p.sock);
  }

  void expire(Clock::time_point now) {
    for (auto& p : pending_) {
      if (p->deadline <= now) {
        reject(*p, "it did not complete the handshake within " +
                        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kHandshakeLimit).count()) + " s");
      }
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& p) { return !p->sock.valid(); }),
                   pending_.end());
  }

  // A foreign or broken connection: logged (a bounded number of times) and closed; never fatal.
  void reject(Incoming& p, const std::string& why) {
    ++rejected_;
    if (rejected_ <= kMaxRejectionWarnings) {
      std::string who = p.hs.peer_introduced() ? " (it said it is rank " + std::to_string(p.hs.peer_rank()) + ")" : "";
      log(LogLevel::kWarn, "rank ", rank_, " closed a connection from ", p.from, who, ": ", why);
    } else {
      ++suppressed_;
    }
    p.sock.close();
  }

  [[noreturn]] void timed_out() {
    std::string ranks;
    for (int peer = rank_ + 1; peer < size_; ++peer) {
      bool all = true;
      for (int lane = 0; lane < mesh_.nsocks; ++lane) all = all && mesh_.peers[peer * mesh_.nsocks + lane].valid();
      if (!all) ranks += (ranks.empty() ? "" : ", ") + std::to_string(peer);
    }
    std::string rejected = rejected_ == 0 ? "" : " (" + std::to_string(rejected_) +
                                                     " connection(s) were rejected: see the warnings above)";
    fail(Error::Kind::kTimeout, "rank ", rank_, " timed out on ", listener_.address(), " waiting for rank(s) ", ranks,
         " to connect", rejected, ": is that process running, and can it reach this address?");
  }

  Listener& listener_;
  Mesh& mesh_;
  const std::string& secret_;
  int rank_;
  int size_;
  LaneSpec lanes_;
  std::deque<std::unique_ptr<Incoming>> pending_;
  int rejected_ = 0;
  int suppressed_ = 0;
};

}  // namespace

LaneSpec lane_spec(const Config& config) {
  return LaneSpec{0, config.nsocks, config.rd_max_bytes, static_cast<uint8_t>(config.algo), selection_digest(config)};
}

std::string agree_on_secret(Store& store, int rank, const Config& config) {
  const bool have_own = !config.auth_secret.empty();
  if (rank == 0) {
    if (have_own) {
      store.set(kAuthKey, "user");  // nothing secret in the Store
      return config.auth_secret;
    }
    uint8_t bytes[kSecretBytes];
    random_bytes(bytes, sizeof(bytes));
    std::string secret = hex(bytes, sizeof(bytes));
    store.set(kAuthKey, "job:" + secret);
    return secret;
  }
  std::string mode = store_get(store, kAuthKey, rank, "rank 0 to publish how connections are authenticated");
  if (mode == "user") {
    if (!have_own)
      fail(Error::Kind::kInvalidArgument, "rank 0 authenticates connections with its MCCL_AUTH_SECRET (or "
           "MCCL_AUTH_SECRET_FILE), but rank ", rank, " has neither set: set the same secret on every host");
    return config.auth_secret;
  }
  if (mode.compare(0, 4, "job:") == 0 && mode.size() == 4 + 2 * kSecretBytes) {
    if (have_own)
      fail(Error::Kind::kInvalidArgument, "rank ", rank, " has ", config.auth_secret_source, " set, but rank 0 has "
           "no MCCL_AUTH_SECRET / MCCL_AUTH_SECRET_FILE: set the same secret on every host, or on none");
    return mode.substr(4);
  }
  fail(Error::Kind::kProtocol, "rank ", rank, " found an unexpected value under '", kAuthKey,
       "' in the Store: does rank 0 run a different lightning-mccl version?");
}

Mesh connect_mesh(Store& store, int rank, int size, const std::string& listen_host, Deadline deadline,
                  const Config& config) {
  Mesh mesh;
  mesh.nsocks = config.nsocks;
  mesh.peers.resize(static_cast<size_t>(size) * config.nsocks);
  mesh.peer_addresses.resize(size);
  if (size == 1) return mesh;

  // Room for peers and strangers arriving at once.
  Listener listener(listen_host, std::max(size * config.nsocks, 128), config.port_min, config.port_max);
  mesh.listen_address = listener.address();
  log(LogLevel::kInfo, "rank ", rank, "/", size, " listening on ", mesh.listen_address, " (",
      config.socket_ifname.empty() ? "the address that routes to MASTER_ADDR" : "MCCL_SOCKET_IFNAME=" + config.socket_ifname,
      "), connecting to ", size - 1, " peer(s)");
  if (rank == 0) {
    random_bytes(&mesh.comm_id, sizeof(mesh.comm_id));
    store.set("mccl/comm_id", std::to_string(mesh.comm_id));
  }
  const std::string secret = agree_on_secret(store, rank, config);
  store.set("mccl/addr/" + std::to_string(rank), mesh.listen_address);
  if (rank != 0) mesh.comm_id = std::stoull(store_get(store, "mccl/comm_id", rank, "rank 0's communicator id"));
  for (int peer = 0; peer < size; ++peer) {
    mesh.peer_addresses[peer] =
        peer == rank ? mesh.listen_address
                     : store_get(store, "mccl/addr/" + std::to_string(peer), rank,
                                 "rank " + std::to_string(peer) + " to publish its address");
  }

  // Lower ranks: connect and authenticate, each lane. Rank 0 connects to nobody, so this never cycles.
  LaneSpec lanes = lane_spec(config);
  for (int peer = 0; peer < rank; ++peer) {
    for (int lane = 0; lane < config.nsocks; ++lane) {
      std::string what = "rank " + std::to_string(peer) + " at " + mesh.peer_addresses[peer];
      uint8_t nonce[kNonceBytes];
      random_bytes(nonce, sizeof(nonce));
      lanes.lane = lane;
      Handshake hs(HandshakeRole::kConnector, secret, mesh.comm_id, rank, size, peer, nonce, lanes);
      mesh.peers[peer * config.nsocks + lane] = connect_and_authenticate(hs, mesh.peer_addresses[peer], deadline, rank, what);
    }
  }

  // Higher ranks: accept until each has proved itself. Anything else that connects (a port scanner,
  // another job, a wrong secret) is logged and closed; it does not fail the rendezvous.
  lanes.lane = 0;
  Acceptor(listener, mesh, secret, rank, size, lanes).run(deadline);
  log(LogLevel::kInfo, "rank ", rank, "/", size, " connected to all peers (authenticated), listening on ",
      mesh.listen_address, " until now");
  return mesh;
}

}  // namespace mccl
