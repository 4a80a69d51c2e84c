#include "config.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "error.h"
#include "log.h"

namespace mccl {
namespace {

// Every variable from_env reads: a backend option naming anything else is a typo.
const char* const kVariables[] = {
    "MCCL_SOCKET_IFNAME", "MCCL_PORT_RANGE", "MCCL_ALGO", "MCCL_RD_MAX_BYTES", "MCCL_BROADCAST_ALGO",
    "MCCL_BROADCAST_TREE_MAX_BYTES", "MCCL_REDUCE_ALGO", "MCCL_REDUCE_TREE_MAX_BYTES", "MCCL_ALLGATHER_ALGO",
    "MCCL_ALLGATHER_BRUCK_MAX_BYTES", "MCCL_REDUCE_SCATTER_ALGO", "MCCL_REDUCE_SCATTER_RD_MAX_BYTES",
    "MCCL_CHUNK_BYTES", "MCCL_NSOCKS", "MCCL_RING_LOOKAHEAD_BYTES", "MCCL_SOCKET_BUFFER_BYTES",
    "MCCL_MAX_MESSAGE_BYTES", "MCCL_WIRE_DTYPE", "MCCL_SPIN_US", "MCCL_TIMELINE_ENTRIES", "MCCL_SEND_THREAD_BYTES",
    "MCCL_REDUCE_THREADS", "MCCL_DEBUG", "MCCL_AUTH_SECRET", "MCCL_AUTH_SECRET_FILE", "MCCL_HEARTBEAT_INTERVAL",
    "MCCL_HEARTBEAT_TIMEOUT",
};

// Where values come from: the group's settings first, then the environment. Empty means unset.
class Reader {
 public:
  explicit Reader(const Settings& given) : given_(given) {
    for (const auto& setting : given_) {
      const std::string& name = setting.first;
      if (std::find_if(std::begin(kVariables), std::end(kVariables),
                       [&](const char* v) { return name == v; }) == std::end(kVariables))
        fail(Error::Kind::kInvalidArgument, "unknown MCCL setting '", name, "' (the settings are the MCCL_* "
             "variables, e.g. MCCL_SPIN_US; see docs/settings.md)");
    }
  }

  const char* get(const char* name) const {
    auto it = given_.find(name);
    const char* value = it != given_.end() ? it->second.c_str() : std::getenv(name);
    return (value != nullptr && value[0] != '\0') ? value : nullptr;
  }

  uint64_t bytes(const char* name, uint64_t fallback, uint64_t min_value) const {
    const char* value = get(name);
    if (value == nullptr) return fallback;
    char* end = nullptr;
    errno = 0;
    unsigned long long parsed = std::strtoull(value, &end, 10);
    const bool out_of_range = errno == ERANGE;
    std::string suffix = end ? end : "";
    uint64_t scale = 1;
    if (suffix == "K" || suffix == "k" || suffix == "KiB") scale = 1024;
    else if (suffix == "M" || suffix == "m" || suffix == "MiB") scale = 1024 * 1024;
    else if (suffix == "G" || suffix == "g" || suffix == "GiB") scale = 1024ull * 1024 * 1024;
    else if (!suffix.empty() || end == value || value[0] == '-')
      fail(Error::Kind::kInvalidArgument, name, "='", value, "' is not a byte count (examples: 65536, 64K, 4M)");
    if (out_of_range || parsed > UINT64_MAX / scale)
      fail(Error::Kind::kInvalidArgument, name, "='", value, "' is too large (a byte count is below 16 EiB)");
    uint64_t bytes = parsed * scale;
    if (bytes < min_value) fail(Error::Kind::kInvalidArgument, name, "='", value, "' is below the minimum of ", min_value);
    return bytes;
  }

  // A plain number in [min_value, max_value]: no byte suffix (MCCL_NSOCKS=2K is a mistake, not 2048).
  uint64_t count(const char* name, uint64_t fallback, uint64_t min_value, uint64_t max_value) const {
    const char* value = get(name);
    if (value == nullptr) return fallback;
    const std::string text = value;
    if (text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
      fail(Error::Kind::kInvalidArgument, name, "='", text, "' is not a whole number (it counts, so it takes no "
           "unit or K/M/G suffix; example: ", name, "=", fallback, ")");
    const uint64_t n = std::stoull(text);
    if (n < min_value || n > max_value)
      fail(Error::Kind::kInvalidArgument, name, "=", n, " is outside ", min_value, "-", max_value);
    return n;
  }

  // Seconds, fractions allowed ("2", "0.5"); returned in milliseconds.
  std::chrono::milliseconds seconds(const char* name, std::chrono::milliseconds fallback) const {
    const char* value = get(name);
    if (value == nullptr) return fallback;
    char* end = nullptr;
    double seconds = std::strtod(value, &end);
    if (end == value || *end != '\0' || !std::isfinite(seconds) || seconds < 0 || seconds > 1e6)
      fail(Error::Kind::kInvalidArgument, name, "='", value, "' is not a number of seconds (examples: 30, 0.5)");
    return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
  }

  // One of `choices` (name, value pairs); `fallback` when unset.
  template <typename T, size_t N>
  T choice(const char* name, T fallback, const std::pair<const char*, T> (&choices)[N], const char* listed) const {
    const char* value = get(name);
    if (value == nullptr) return fallback;
    for (const auto& [text, v] : choices)
      if (std::string(value) == text) return v;
    fail(Error::Kind::kInvalidArgument, name, "='", value, "' is not one of ", listed);
  }

 private:
  const Settings& given_;
};

// "LOW-HIGH", 1 <= LOW <= HIGH <= 65535.
void read_port_range(const Reader& in, Config& c) {
  const char* value = in.get("MCCL_PORT_RANGE");
  if (value == nullptr) return;
  const std::string text = value;
  const auto dash = text.find('-');
  auto port = [&](const std::string& part) -> long {
    if (part.empty() || part.size() > 5 || part.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stol(part);
  };
  const long low = dash == std::string::npos ? -1 : port(text.substr(0, dash));
  const long high = dash == std::string::npos ? -1 : port(text.substr(dash + 1));
  if (low < 1 || high < 1 || low > 65535 || high > 65535 || low > high)
    fail(Error::Kind::kInvalidArgument, "MCCL_PORT_RANGE='", text,
         "' is not a port range LOW-HIGH with 1 <= LOW <= HIGH <= 65535 (example: 29600-29700)");
  c.port_min = static_cast<uint16_t>(low);
  c.port_max = static_cast<uint16_t>(high);
}

constexpr size_t kMinSecretBytes = 16;

std::string strip_trailing_space(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ' || text.back() == '\t'))
    text.pop_back();
  return text;
}

void read_auth_secret(const Reader& in, Config& c) {
  const char* inline_secret = in.get("MCCL_AUTH_SECRET");
  const char* path = in.get("MCCL_AUTH_SECRET_FILE");
  if (inline_secret && path)
    fail(Error::Kind::kInvalidArgument, "both MCCL_AUTH_SECRET and MCCL_AUTH_SECRET_FILE are set: set only one");
  if (inline_secret) {
    c.auth_secret = inline_secret;
    c.auth_secret_source = "MCCL_AUTH_SECRET";
  } else if (path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) fail(Error::Kind::kInvalidArgument, "MCCL_AUTH_SECRET_FILE='", path, "' cannot be read");
    std::ostringstream contents;
    contents << file.rdbuf();
    c.auth_secret = strip_trailing_space(contents.str());
    c.auth_secret_source = std::string("MCCL_AUTH_SECRET_FILE=") + path;
  } else {
    return;
  }
  if (c.auth_secret.size() < kMinSecretBytes)
    fail(Error::Kind::kInvalidArgument, c.auth_secret_source, " holds a secret of ", c.auth_secret.size(),
         " bytes; use at least ", kMinSecretBytes, " random characters (e.g. the output of `openssl rand -hex 32`)");
}

using A = AlgoChoice;
constexpr std::pair<const char*, A> kAllreduceAlgos[] = {
    {"auto", A::kAuto}, {"ring", A::kRing}, {"rd", A::kRecursiveDoubling}, {"recursive_doubling", A::kRecursiveDoubling}};
constexpr std::pair<const char*, A> kRootedAlgos[] = {{"auto", A::kAuto}, {"tree", A::kTree}, {"ring", A::kRing}};
constexpr std::pair<const char*, A> kAllgatherAlgos[] = {{"auto", A::kAuto}, {"ring", A::kRing}, {"bruck", A::kBruck}};
constexpr std::pair<const char*, DataType> kWireTypes[] = {
    {"off", DataType::kFloat32},     {"none", DataType::kFloat32},     {"float32", DataType::kFloat32},
    {"fp32", DataType::kFloat32},    {"bf16", DataType::kBFloat16},    {"bfloat16", DataType::kBFloat16},
    {"fp16", DataType::kFloat16},    {"float16", DataType::kFloat16},  {"half", DataType::kFloat16}};

}  // namespace

Config Config::from_env(const Settings& given) {
  const Reader in(given);
  Config c;
  if (const char* v = in.get("MCCL_SOCKET_IFNAME")) c.socket_ifname = v;
  read_port_range(in, c);
  c.algo = in.choice("MCCL_ALGO", c.algo, kAllreduceAlgos, "auto, ring, rd");
  c.rd_max_bytes = in.bytes("MCCL_RD_MAX_BYTES", c.rd_max_bytes, 0);
  c.broadcast_algo = in.choice("MCCL_BROADCAST_ALGO", c.broadcast_algo, kRootedAlgos, "auto, tree, ring");
  c.broadcast_tree_max_bytes = in.bytes("MCCL_BROADCAST_TREE_MAX_BYTES", c.broadcast_tree_max_bytes, 0);
  c.reduce_algo = in.choice("MCCL_REDUCE_ALGO", c.reduce_algo, kRootedAlgos, "auto, tree, ring");
  c.reduce_tree_max_bytes = in.bytes("MCCL_REDUCE_TREE_MAX_BYTES", c.reduce_tree_max_bytes, 0);
  c.allgather_algo = in.choice("MCCL_ALLGATHER_ALGO", c.allgather_algo, kAllgatherAlgos, "auto, ring, bruck");
  c.allgather_bruck_max_bytes = in.bytes("MCCL_ALLGATHER_BRUCK_MAX_BYTES", c.allgather_bruck_max_bytes, 0);
  c.reduce_scatter_algo = in.choice("MCCL_REDUCE_SCATTER_ALGO", c.reduce_scatter_algo, kAllreduceAlgos, "auto, ring, rd");
  c.reduce_scatter_rd_max_bytes = in.bytes("MCCL_REDUCE_SCATTER_RD_MAX_BYTES", c.reduce_scatter_rd_max_bytes, 0);
  c.chunk_bytes = in.bytes("MCCL_CHUNK_BYTES", c.chunk_bytes, 8);
  if (c.chunk_bytes > (size_t(1) << 30))
    fail(Error::Kind::kInvalidArgument, "MCCL_CHUNK_BYTES=", c.chunk_bytes, " is larger than 1 GiB");
  c.nsocks = static_cast<int>(in.count("MCCL_NSOCKS", static_cast<uint64_t>(c.nsocks), 1, 16));
  c.ring_lookahead_bytes = in.bytes("MCCL_RING_LOOKAHEAD_BYTES", c.ring_lookahead_bytes, 0);
  c.socket_buffer_bytes = in.bytes("MCCL_SOCKET_BUFFER_BYTES", c.socket_buffer_bytes, 0);
  if (c.socket_buffer_bytes > static_cast<size_t>(INT_MAX))  // rejected rather than cut down to fit
    fail(Error::Kind::kInvalidArgument, "MCCL_SOCKET_BUFFER_BYTES=", c.socket_buffer_bytes, " is larger than ",
         INT_MAX, " bytes (2 GiB - 1), the most SO_SNDBUF / SO_RCVBUF take (an int)");
  c.max_message_bytes = in.bytes("MCCL_MAX_MESSAGE_BYTES", c.max_message_bytes, 1024);
  c.wire_dtype = in.choice("MCCL_WIRE_DTYPE", c.wire_dtype, kWireTypes, "off, bf16, fp16");
  c.spin_us = static_cast<uint32_t>(in.count("MCCL_SPIN_US", c.spin_us, 0, 10'000'000));
  c.timeline_entries = static_cast<size_t>(in.count("MCCL_TIMELINE_ENTRIES", c.timeline_entries, 0, 1'000'000));
  if (const char* v = in.get("MCCL_SEND_THREAD_BYTES"); v && std::string(v) != "auto") {
    c.send_thread_bytes = in.bytes("MCCL_SEND_THREAD_BYTES", c.send_thread_bytes, 0);
    c.send_thread_auto = false;
  }
  if (const char* v = in.get("MCCL_REDUCE_THREADS"); v && std::string(v) != "auto")
    c.reduce_threads = static_cast<size_t>(in.count("MCCL_REDUCE_THREADS", 1, 1, kMaxReduceThreads));
  if (const char* v = in.get("MCCL_DEBUG"); v && parse_log_level(v) < 0)
    fail(Error::Kind::kInvalidArgument, "MCCL_DEBUG='", v, "' is not one of ERROR, WARN, INFO, TRACE (or 0-3)");
  read_auth_secret(in, c);
  c.heartbeat_interval = in.seconds("MCCL_HEARTBEAT_INTERVAL", c.heartbeat_interval);
  c.heartbeat_timeout = in.seconds("MCCL_HEARTBEAT_TIMEOUT", c.heartbeat_timeout);
  if (c.heartbeat_interval.count() <= 0)
    fail(Error::Kind::kInvalidArgument, "MCCL_HEARTBEAT_INTERVAL must be positive (to disable heartbeats set "
         "MCCL_HEARTBEAT_TIMEOUT=0)");
  return c;
}

size_t Config::send_thread_bytes_for(int local_ranks, unsigned cpus) const {
  if (!send_thread_auto) return send_thread_bytes;
  return cpus >= 4u * static_cast<unsigned>(std::max(local_ranks, 1)) ? send_thread_bytes : 0;
}

size_t Config::reduce_threads_for(int local_ranks, unsigned cpus) const {
  if (reduce_threads != 0) return reduce_threads;
  const unsigned per_rank = cpus / static_cast<unsigned>(std::max(local_ranks, 1));
  return per_rank <= 3 ? 1 : std::min<size_t>(kMaxReduceThreads, per_rank - 2);
}

const Config& Config::global() {
  static const Config config = from_env();
  return config;
}

}  // namespace mccl
