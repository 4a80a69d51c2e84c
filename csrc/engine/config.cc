#include "config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "error.h"

namespace mccl {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && value[0] != '\0') ? value : nullptr;
}

uint64_t env_bytes(const char* name, uint64_t fallback, uint64_t min_value) {
  const char* value = env(name);
  if (value == nullptr) return fallback;
  char* end = nullptr;
  unsigned long long parsed = std::strtoull(value, &end, 10);
  std::string suffix = end ? end : "";
  uint64_t scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") scale = 1024;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") scale = 1024 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") scale = 1024ull * 1024 * 1024;
  else if (!suffix.empty() || end == value)
    fail(Error::Kind::kInvalidArgument, name, "='", value, "' is not a byte count (examples: 65536, 64K, 4M)");
  uint64_t bytes = parsed * scale;
  if (bytes < min_value) fail(Error::Kind::kInvalidArgument, name, "='", value, "' is below the minimum of ", min_value);
  return bytes;
}

// Seconds, fractions allowed ("2", "0.5"); returned in milliseconds.
std::chrono::milliseconds env_seconds(const char* name, std::chrono::milliseconds fallback) {
  const char* value = env(name);
  if (value == nullptr) return fallback;
  char* end = nullptr;
  double seconds = std::strtod(value, &end);
  if (end == value || *end != '\0' || !std::isfinite(seconds) || seconds < 0 || seconds > 1e6)
    fail(Error::Kind::kInvalidArgument, name, "='", value, "' is not a number of seconds (examples: 30, 0.5)");
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}

// "LOW-HIGH", 1 <= LOW <= HIGH <= 65535.
void read_port_range(Config& c) {
  const char* value = env("MCCL_PORT_RANGE");
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

void read_auth_secret(Config& c) {
  const char* inline_secret = env("MCCL_AUTH_SECRET");
  const char* path = env("MCCL_AUTH_SECRET_FILE");
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

}  // namespace

Config Config::from_env() {
  Config c;
  if (const char* v = env("MCCL_SOCKET_IFNAME")) c.socket_ifname = v;
  read_port_range(c);
  if (const char* v = env("MCCL_ALGO")) {
    std::string algo = v;
    if (algo == "auto") c.algo = AlgoChoice::kAuto;
    else if (algo == "ring") c.algo = AlgoChoice::kRing;
    else if (algo == "rd" || algo == "recursive_doubling") c.algo = AlgoChoice::kRecursiveDoubling;
    else fail(Error::Kind::kInvalidArgument, "MCCL_ALGO='", algo, "' is not one of auto, ring, rd");
  }
  c.rd_max_bytes = env_bytes("MCCL_RD_MAX_BYTES", c.rd_max_bytes, 0);
  c.chunk_bytes = env_bytes("MCCL_CHUNK_BYTES", c.chunk_bytes, 8);
  if (c.chunk_bytes > (size_t(1) << 30))
    fail(Error::Kind::kInvalidArgument, "MCCL_CHUNK_BYTES=", c.chunk_bytes, " is larger than 1 GiB");
  const uint64_t nsocks = env_bytes("MCCL_NSOCKS", static_cast<uint64_t>(c.nsocks), 1);
  if (nsocks > 16) fail(Error::Kind::kInvalidArgument, "MCCL_NSOCKS=", nsocks, " is more than 16");
  c.nsocks = static_cast<int>(nsocks);
  c.ring_lookahead_bytes = env_bytes("MCCL_RING_LOOKAHEAD_BYTES", c.ring_lookahead_bytes, 0);
  c.socket_buffer_bytes = env_bytes("MCCL_SOCKET_BUFFER_BYTES", c.socket_buffer_bytes, 0);
  c.max_message_bytes = env_bytes("MCCL_MAX_MESSAGE_BYTES", c.max_message_bytes, 1024);
  if (const char* v = env("MCCL_WIRE_DTYPE")) {
    std::string wire = v;
    if (wire == "off" || wire == "none" || wire == "float32" || wire == "fp32") c.wire_dtype = DataType::kFloat32;
    else if (wire == "bf16" || wire == "bfloat16") c.wire_dtype = DataType::kBFloat16;
    else if (wire == "fp16" || wire == "float16" || wire == "half") c.wire_dtype = DataType::kFloat16;
    else fail(Error::Kind::kInvalidArgument, "MCCL_WIRE_DTYPE='", wire, "' is not one of off, bf16, fp16");
  }
  c.spin_us = static_cast<uint32_t>(env_bytes("MCCL_SPIN_US", c.spin_us, 0));
  if (const char* v = env("MCCL_SEND_THREAD_BYTES"); v && std::string(v) != "auto") {
    c.send_thread_bytes = env_bytes("MCCL_SEND_THREAD_BYTES", c.send_thread_bytes, 0);
    c.send_thread_auto = false;
  }
  if (const char* v = env("MCCL_DEBUG")) {
    std::string level = v;
    if (level == "ERROR" || level == "0") c.debug_level = 0;
    else if (level == "WARN" || level == "1") c.debug_level = 1;
    else if (level == "INFO" || level == "2") c.debug_level = 2;
    else if (level == "TRACE" || level == "3") c.debug_level = 3;
    else fail(Error::Kind::kInvalidArgument, "MCCL_DEBUG='", level, "' is not one of ERROR, WARN, INFO, TRACE (or 0-3)");
  }
  read_auth_secret(c);
  c.heartbeat_interval = env_seconds("MCCL_HEARTBEAT_INTERVAL", c.heartbeat_interval);
  c.heartbeat_timeout = env_seconds("MCCL_HEARTBEAT_TIMEOUT", c.heartbeat_timeout);
  if (c.heartbeat_interval.count() <= 0)
    fail(Error::Kind::kInvalidArgument, "MCCL_HEARTBEAT_INTERVAL must be positive (to disable heartbeats set "
         "MCCL_HEARTBEAT_TIMEOUT=0)");
  return c;
}

size_t Config::send_thread_bytes_for(int local_ranks, unsigned cpus) const {
  if (!send_thread_auto) return send_thread_bytes;
  return cpus >= 4u * static_cast<unsigned>(std::max(local_ranks, 1)) ? send_thread_bytes : 0;
}

const Config& Config::global() {
  static const Config config = from_env();
  return config;
}

}  // namespace mccl
