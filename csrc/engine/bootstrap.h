// Rendezvous and connection setup: every rank listens, publishes "host:port" in the Store, connects to
// every lower rank and accepts every higher one. Each connection is authenticated (handshake.h) with
// the job's secret before it is used: MCCL_AUTH_SECRET when set on every host, else a random secret
// rank 0 puts in the Store. Result: MCCL_NSOCKS connected, authenticated sockets ("lanes") per peer.
// The listening socket is closed before this returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "handshake.h"
#include "socket.h"
#include "store.h"

namespace mccl {

struct Mesh {
  uint64_t comm_id = 0;
  std::string listen_address;             // this rank's "host:port"
  int nsocks = 1;
  std::vector<Socket> peers;              // indexed by rank * nsocks + lane; this rank's own are invalid
  std::vector<std::string> peer_addresses;  // "host:port" of each rank, for messages
};

Mesh connect_mesh(Store& store, int rank, int size, const std::string& listen_host, Deadline deadline,
                  const Config& config = Config::global());

// The frame settings this rank's Hellos carry (lane 0; connect_mesh sets each connection's lane).
LaneSpec lane_spec(const Config& config);

// The secret this communicator's connections prove they know (see Config::auth_secret). Rank 0 decides
// and records the mode in the Store under "mccl/auth"; the others follow it or fail naming the mismatch.
std::string agree_on_secret(Store& store, int rank, const Config& config);

}  // namespace mccl
