// Rendezvous and connection setup: every rank listens, publishes "host:port" in the Store, connects to
// every lower rank and accepts every higher one, and both ends of each connection exchange a Hello that
// names job (communicator id), rank and world size. Result: one connected socket per peer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "socket.h"
#include "store.h"

namespace mccl {

struct Mesh {
  uint64_t comm_id = 0;
  std::string listen_address;             // this rank's "host:port"
  std::vector<Socket> peers;              // indexed by rank; peers[rank] is invalid
  std::vector<std::string> peer_addresses;  // "host:port" of each rank, for messages
};

Mesh connect_mesh(Store& store, int rank, int size, const std::string& listen_host, Deadline deadline);

}  // namespace mccl
