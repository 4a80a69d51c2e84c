#include "bootstrap.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "error.h"
#include "listener.h"
#include "log.h"
#include "wire.h"

namespace mccl {
namespace {

constexpr auto kHandshakeLimit = std::chrono::seconds(10);

std::string store_get(Store& store, const std::string& key, int rank, int peer) {
  try {
    return store.get(key);
  } catch (const Error& e) {
    fail(Error::Kind::kTimeout, "rank ", rank, " timed out in rendezvous waiting for rank ", peer,
         " to publish its address (did every rank call init_process_group with the same world size?): ", e.what());
  }
}

// Returns "" when the Hello is acceptable, else why not.
std::string check_hello(const Hello& h, uint64_t comm_id, int size) {
  std::string bad = check_preamble(h.magic, h.version);
  if (!bad.empty()) return bad;
  if (h.comm_id != comm_id) return "it belongs to another communicator (a different job or process group)";
  if (static_cast<int>(h.world_size) != size)
    return "it says the world size is " + std::to_string(h.world_size) + ", this rank has " + std::to_string(size);
  if (static_cast<int>(h.rank) >= size) return "its rank " + std::to_string(h.rank) + " is out of range";
  return "";
}

Hello make_hello(uint64_t comm_id, int rank, int size) {
  Hello h;
  h.comm_id = comm_id;
  h.rank = static_cast<uint32_t>(rank);
  h.world_size = static_cast<uint32_t>(size);
  return h;
}

}  // namespace

Mesh connect_mesh(Store& store, int rank, int size, const std::string& listen_host, Deadline deadline) {
  Mesh mesh;
  mesh.peers.resize(size);
  mesh.peer_addresses.resize(size);
  if (size == 1) return mesh;

  Listener listener(listen_host, std::max(size, 16));
  mesh.listen_address = listener.address();
  if (rank == 0) {
    std::random_device rd;
    mesh.comm_id = (uint64_t(rd()) << 32) ^ rd();
    store.set("mccl/comm_id", std::to_string(mesh.comm_id));
  }
  store.set("mccl/addr/" + std::to_string(rank), mesh.listen_address);
  if (rank != 0) mesh.comm_id = std::stoull(store_get(store, "mccl/comm_id", rank, 0));
  for (int peer = 0; peer < size; ++peer) {
    mesh.peer_addresses[peer] =
        peer == rank ? mesh.listen_address : store_get(store, "mccl/addr/" + std::to_string(peer), rank, peer);
  }
  const Hello mine = make_hello(mesh.comm_id, rank, size);

  // Lower ranks: connect, send our Hello, read theirs. Rank 0 connects to nobody, so this never cycles.
  for (int peer = 0; peer < rank; ++peer) {
    std::string what = "rank " + std::to_string(peer) + " at " + mesh.peer_addresses[peer];
    Socket sock = Socket::connect_to(parse_address(mesh.peer_addresses[peer]), deadline, what);
    sock.write_all(&mine, sizeof(mine), deadline, what);
    Hello theirs;
    sock.read_all(&theirs, sizeof(theirs), deadline, what);
    std::string bad = check_hello(theirs, mesh.comm_id, size);
    if (bad.empty() && static_cast<int>(theirs.rank) != peer) bad = "it says it is rank " + std::to_string(theirs.rank);
    if (!bad.empty()) fail(Error::Kind::kProtocol, "rank ", rank, " rejected the connection to ", what, ": ", bad);
    mesh.peers[peer] = std::move(sock);
  }

  // Higher ranks: accept until each has introduced itself. Anything else that connects (a port scanner,
  // another job) is logged and closed; it does not fail the rendezvous.
  int missing = size - 1 - rank;
  while (missing > 0) {
    std::string waiting = std::to_string(missing) + " higher rank(s)";
    Socket sock = listener.accept(deadline, waiting);
    Hello theirs;
    std::string bad;
    try {
      sock.read_all(&theirs, sizeof(theirs), std::min(deadline, Clock::now() + kHandshakeLimit), "a connecting peer");
      bad = check_hello(theirs, mesh.comm_id, size);
      int peer = static_cast<int>(theirs.rank);
      if (bad.empty() && peer <= rank) bad = "rank " + std::to_string(peer) + " should not connect to a higher rank";
      if (bad.empty() && mesh.peers[peer].valid()) bad = "rank " + std::to_string(peer) + " connected twice";
    } catch (const Error& e) {
      bad = e.what();
    }
    if (!bad.empty()) {
      log(LogLevel::kWarn, "rank ", rank, " closed a connection from ", format_address(sock.peer_address()), ": ", bad);
      continue;
    }
    int peer = static_cast<int>(theirs.rank);
    sock.write_all(&mine, sizeof(mine), deadline, "rank " + std::to_string(peer));
    mesh.peers[peer] = std::move(sock);
    --missing;
  }
  log(LogLevel::kInfo, "rank ", rank, "/", size, " connected to all peers, listening on ", mesh.listen_address);
  return mesh;
}

}  // namespace mccl
