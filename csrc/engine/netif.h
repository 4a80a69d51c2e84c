// Which local address a rank listens on.
#pragma once

#include <string>

#include <utility>
#include <vector>

namespace mccl {

// (interface name, numeric address) for every IPv4/IPv6 address of every interface.
std::vector<std::pair<std::string, std::string>> list_interfaces();

// Order: the interface named by `ifname` (MCCL_SOCKET_IFNAME; an unknown name is an error that lists
// the interfaces there are), else the source address the OS would use to reach `route_to`
// (MASTER_ADDR; no packet is sent), else 127.0.0.1.
std::string choose_listen_host(const std::string& ifname, const std::string& route_to);

}  // namespace mccl
