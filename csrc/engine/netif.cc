#include "netif.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "error.h"

namespace mccl {
namespace {

std::string numeric_host(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, host, sizeof(host));
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, host, sizeof(host));
  return host;
}

std::string address_of_interface(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) fail(Error::Kind::kConnection, "getifaddrs failed: ", std::strerror(errno));
  std::string v4, v6;
  std::set<std::string> names;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    names.insert(it->ifa_name);
    if (ifname != it->ifa_name) continue;
    if (it->ifa_addr->sa_family == AF_INET && v4.empty()) v4 = numeric_host(it->ifa_addr);
    if (it->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      auto* in6 = reinterpret_cast<const sockaddr_in6*>(it->ifa_addr);
      if (!IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) v6 = numeric_host(it->ifa_addr);
    }
  }
  freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  fail(Error::Kind::kInvalidArgument, "MCCL_SOCKET_IFNAME=", ifname,
       " names no interface with an IP address here; interfaces: ", known);
}

std::string address_routing_to(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &result) != 0 || result == nullptr) return "";
  std::string chosen;
  int fd = ::socket(result->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0 && ::connect(fd, result->ai_addr, result->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0)
      chosen = numeric_host(reinterpret_cast<sockaddr*>(&local));
  }
  if (fd >= 0) ::close(fd);
  freeaddrinfo(result);
  return chosen;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> list_interfaces() {
  std::vector<std::pair<std::string, std::string>> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) fail(Error::Kind::kConnection, "getifaddrs failed: ", std::strerror(errno));
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    int family = it->ifa_addr->sa_family;
    if (family == AF_INET || family == AF_INET6) found.emplace_back(it->ifa_name, numeric_host(it->ifa_addr));
  }
  freeifaddrs(list);
  return found;
}

std::string choose_listen_host(const std::string& ifname, const std::string& route_to) {
  if (!ifname.empty()) return address_of_interface(ifname);
  if (!route_to.empty()) {
    std::string via = address_routing_to(route_to);
    if (!via.empty() && via != "0.0.0.0" && via != "::") return via;
  }
  return "127.0.0.1";
}

}  // namespace mccl
