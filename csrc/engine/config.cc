#include "config.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "error.h"
#include "log.h"

namespace mccl {

// One variable's value: what the group's settings or the environment say, else the variable's declared
// default. Its parsers throw kInvalidArgument naming the variable and the value.
class Value {
 public:
  Value(const Variable& variable, std::string text)
      : name_(variable.name), fallback_(variable.fallback), text_(std::move(text)) {}
  const char* name() const { return name_; }
  const std::string& text() const { return text_; }
  bool is(const char* text) const { return text_ == text; }

  // Bytes, with an optional K/M/G (KiB/MiB/GiB) suffix, at least `min_value`.
  uint64_t bytes(uint64_t min_value) const {
    const char* value = text_.c_str();
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
      fail(Error::Kind::kInvalidArgument, name_, "='", text_, "' is not a byte count (examples: 65536, 64K, 4M)");
    if (out_of_range || parsed > UINT64_MAX / scale)
      fail(Error::Kind::kInvalidArgument, name_, "='", text_, "' is too large (a byte count is below 16 EiB)");
    uint64_t bytes = parsed * scale;
    if (bytes < min_value) fail(Error::Kind::kInvalidArgument, name_, "='", text_, "' is below the minimum of ", min_value);
    return bytes;
  }

  // A plain number in [min_value, max_value]: no byte suffix (MCCL_NSOCKS=2K is a mistake, not 2048).
  uint64_t count(uint64_t min_value, uint64_t max_value) const {
    if (text_.size() > 9 || text_.find_first_not_of("0123456789") != std::string::npos) {
      const std::string fallback = fallback_;
      const bool numeric_default = !fallback.empty() && fallback.find_first_not_of("0123456789") == std::string::npos;
      fail(Error::Kind::kInvalidArgument, name_, "='", text_, "' is not a whole number (it counts, so it takes no "
           "unit or K/M/G suffix; example: ", name_, "=", numeric_default ? fallback : std::to_string(min_value), ")");
    }
    const uint64_t n = std::stoull(text_);
    if (n < min_value || n > max_value)
      fail(Error::Kind::kInvalidArgument, name_, "=", n, " is outside ", min_value, "-", max_value);
    return n;
  }

  // Seconds, fractions allowed ("2", "0.5"); returned in milliseconds.
  std::chrono::milliseconds seconds() const {
    char* end = nullptr;
    double seconds = std::strtod(text_.c_str(), &end);
    if (end == text_.c_str() || *end != '\0' || !std::isfinite(seconds) || seconds < 0 || seconds > 1e6)
      fail(Error::Kind::kInvalidArgument, name_, "='", text_, "' is not a number of seconds (examples: 30, 0.5)");
    return std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
  }

  // One of `choices` (name, value pairs); `listed` names the ones to offer in the error.
  template <typename T, size_t N>
  T choice(const std::pair<const char*, T> (&choices)[N], const char* listed) const {
    for (const auto& [text, v] : choices)
      if (text_ == text) return v;
    fail(Error::Kind::kInvalidArgument, name_, "='", text_, "' is not one of ", listed);
  }

 private:
  const char* name_;
  const char* fallback_;
  std::string text_;
};

namespace {

using A = AlgoChoice;
constexpr std::pair<const char*, A> kAllreduceAlgos[] = {
    {"auto", A::kAuto}, {"ring", A::kRing}, {"rd", A::kRecursiveDoubling}, {"recursive_doubling", A::kRecursiveDoubling}};
constexpr std::pair<const char*, A> kRootedAlgos[] = {{"auto", A::kAuto}, {"tree", A::kTree}, {"ring", A::kRing}};
constexpr std::pair<const char*, A> kAllgatherAlgos[] = {{"auto", A::kAuto}, {"ring", A::kRing}, {"bruck", A::kBruck}};
constexpr std::pair<const char*, A> kInt8Algos[] = {{"auto", A::kAuto}, {"exchange", A::kExchange}, {"ring", A::kRing}};
// MCCL_WIRE_DTYPE's values, a wire type's usual name first: a new wire type is one more row.
constexpr std::pair<const char*, DataType> kWireTypes[] = {
    {"off", DataType::kFloat32},  {"none", DataType::kFloat32},     {"float32", DataType::kFloat32},
    {"fp32", DataType::kFloat32}, {"bf16", DataType::kBFloat16},    {"bfloat16", DataType::kBFloat16},
    {"fp16", DataType::kFloat16}, {"float16", DataType::kFloat16},  {"half", DataType::kFloat16}};
constexpr std::pair<const char*, bool> kInPlace[] = {{"auto", true}, {"0", false}};
constexpr std::pair<const char*, bool> kAlltoallGates[] = {{"both", false}, {"send", true}};

// The usual names of kWireTypes, "off, bf16, fp16", for the error that lists them.
std::string wire_type_names() {
  std::string listed;
  for (const auto& [text, wire] : kWireTypes)
    if (text == std::string(wire_type_name(wire))) listed += (listed.empty() ? "" : ", ") + std::string(text);
  return listed;
}

// "LOW-HIGH", 1 <= LOW <= HIGH <= 65535; "" (unset): 0-0.
void read_port_range(const Value& v, Config& c) {
  c.port_min = c.port_max = 0;
  if (v.text().empty()) return;
  const std::string& text = v.text();
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

// MCCL_AUTH_SECRET's row comes first and keeps the text; MCCL_AUTH_SECRET_FILE's then checks the pair.
void read_auth_secret_file(const Value& v, Config& c) {
  if (!v.text().empty()) {
    if (!c.auth_secret_source.empty())
      fail(Error::Kind::kInvalidArgument, "both MCCL_AUTH_SECRET and MCCL_AUTH_SECRET_FILE are set: set only one");
    std::ifstream file(v.text(), std::ios::binary);
    if (!file) fail(Error::Kind::kInvalidArgument, "MCCL_AUTH_SECRET_FILE='", v.text(), "' cannot be read");
    std::ostringstream contents;
    contents << file.rdbuf();
    c.auth_secret = strip_trailing_space(contents.str());
    c.auth_secret_source = "MCCL_AUTH_SECRET_FILE=" + v.text();
  }
  if (!c.auth_secret_source.empty() && c.auth_secret.size() < kMinSecretBytes)
    fail(Error::Kind::kInvalidArgument, c.auth_secret_source, " holds a secret of ", c.auth_secret.size(),
         " bytes; use at least ", kMinSecretBytes, " random characters (e.g. the output of `openssl rand -hex 32`)");
}

// MCCL_SEND_THREAD_BYTES=auto: frames of this size and more go to the sender thread where a host has the CPUs.
constexpr size_t kAutoSendThreadBytes = 512 * 1024;

using Scope = Variable::Scope;

// Every variable: name, default, scope, a line of documentation, and its parser. Constant-initialized, so
// a Config made by another file's static initializer finds it.
constexpr Variable kVariables[] = {
    {"MCCL_SOCKET_IFNAME", "", Scope::kGroup, "interface to listen on; unset: the one that routes to MASTER_ADDR",
     [](const Value& v, Config& c) { c.socket_ifname = v.text(); }},
    {"MCCL_PORT_RANGE", "", Scope::kGroup, "LOW-HIGH: the only ports a rank listens on; unset: any",
     read_port_range},
    {"MCCL_ALGO", "auto", Scope::kGroup, "allreduce algorithm: auto (the table), ring, rd",
     [](const Value& v, Config& c) { c.algo = v.choice(kAllreduceAlgos, "auto, ring, rd"); }},
    {"MCCL_RD_MAX_BYTES", "0", Scope::kGroup, "in auto, allreduces up to this size use recursive doubling; 0: the table",
     [](const Value& v, Config& c) { c.rd_max_bytes = v.bytes(0); }},
    {"MCCL_BROADCAST_ALGO", "auto", Scope::kGroup, "auto, tree, ring",
     [](const Value& v, Config& c) { c.broadcast_algo = v.choice(kRootedAlgos, "auto, tree, ring"); }},
    {"MCCL_BROADCAST_TREE_MAX_BYTES", "0", Scope::kGroup, "in auto, broadcasts up to this size use the tree; 0: the table",
     [](const Value& v, Config& c) { c.broadcast_tree_max_bytes = v.bytes(0); }},
    {"MCCL_REDUCE_ALGO", "auto", Scope::kGroup, "auto, tree, ring",
     [](const Value& v, Config& c) { c.reduce_algo = v.choice(kRootedAlgos, "auto, tree, ring"); }},
    {"MCCL_REDUCE_TREE_MAX_BYTES", "0", Scope::kGroup, "in auto, reduces up to this size use the tree; 0: the table",
     [](const Value& v, Config& c) { c.reduce_tree_max_bytes = v.bytes(0); }},
    {"MCCL_ALLGATHER_ALGO", "auto", Scope::kGroup, "auto, ring, bruck",
     [](const Value& v, Config& c) { c.allgather_algo = v.choice(kAllgatherAlgos, "auto, ring, bruck"); }},
    {"MCCL_ALLGATHER_BRUCK_MAX_BYTES", "0", Scope::kGroup, "in auto, all-gathers up to this output size use Bruck's",
     [](const Value& v, Config& c) { c.allgather_bruck_max_bytes = v.bytes(0); }},
    {"MCCL_REDUCE_SCATTER_ALGO", "auto", Scope::kGroup, "auto, ring, rd",
     [](const Value& v, Config& c) { c.reduce_scatter_algo = v.choice(kAllreduceAlgos, "auto, ring, rd"); }},
    {"MCCL_REDUCE_SCATTER_RD_MAX_BYTES", "0", Scope::kGroup, "in auto, reduce-scatters up to this input size use rd",
     [](const Value& v, Config& c) { c.reduce_scatter_rd_max_bytes = v.bytes(0); }},
    {"MCCL_INT8_ALGO", "auto", Scope::kGroup, "8-bit allreduce algorithm: auto (the table), exchange, ring",
     [](const Value& v, Config& c) { c.int8_algo = v.choice(kInt8Algos, "auto, exchange, ring"); }},
    {"MCCL_INT8_EXCHANGE_MAX_BYTES", "0", Scope::kGroup, "in auto, 8-bit allreduces up to this float32 size use the exchange",
     [](const Value& v, Config& c) { c.int8_exchange_max_bytes = v.bytes(0); }},
    {"MCCL_ALLTOALL_WINDOW", "0", Scope::kGroup, "all-to-all rounds in flight; 0: every peer at once",
     [](const Value& v, Config& c) { c.alltoall_window = static_cast<size_t>(v.count(0, 1'000'000)); }},
    {"MCCL_ALLTOALL_WINDOW_GATE", "both", Scope::kGroup, "what starts the next round: both (send and receive), send",
     [](const Value& v, Config& c) { c.alltoall_gate_send = v.choice(kAlltoallGates, "both, send"); }},
    {"MCCL_CHUNK_BYTES", "512K", Scope::kGroup, "the ring's pipelining piece, in bytes on the wire",
     [](const Value& v, Config& c) {
       c.chunk_bytes = v.bytes(8);
       if (c.chunk_bytes > (size_t(1) << 30))
         fail(Error::Kind::kInvalidArgument, "MCCL_CHUNK_BYTES=", c.chunk_bytes, " is larger than 1 GiB");
     }},
    {"MCCL_SEND_THREAD_BYTES", "auto", Scope::kGroup, "frames of at least this size are written by a sender thread",
     [](const Value& v, Config& c) {
       c.send_thread_auto = v.is("auto");
       c.send_thread_bytes = c.send_thread_auto ? kAutoSendThreadBytes : v.bytes(0);
     }},
    {"MCCL_REDUCE_THREADS", "auto", Scope::kGroup, "threads that share each received piece's element-wise work",
     [](const Value& v, Config& c) { c.reduce_threads = v.is("auto") ? 0 : v.count(1, kMaxReduceThreads); }},
    {"MCCL_NSOCKS", "1", Scope::kGroup, "TCP connections between every two ranks, 1-16",
     [](const Value& v, Config& c) { c.nsocks = static_cast<int>(v.count(1, 16)); }},
    {"MCCL_RING_LOOKAHEAD_BYTES", "64M", Scope::kGroup, "scratch the ring may use to post later receives early",
     [](const Value& v, Config& c) { c.ring_lookahead_bytes = v.bytes(0); }},
    {"MCCL_SOCKET_BUFFER_BYTES", "0", Scope::kGroup, "SO_SNDBUF/SO_RCVBUF of data sockets; 0: the OS's autotuning",
     [](const Value& v, Config& c) {
       c.socket_buffer_bytes = v.bytes(0);
       if (c.socket_buffer_bytes > static_cast<size_t>(INT_MAX))  // rejected rather than cut down to fit
         fail(Error::Kind::kInvalidArgument, "MCCL_SOCKET_BUFFER_BYTES=", c.socket_buffer_bytes, " is larger than ",
              INT_MAX, " bytes (2 GiB - 1), the most SO_SNDBUF / SO_RCVBUF take (an int)");
     }},
    {"MCCL_MAX_MESSAGE_BYTES", "64G", Scope::kGroup, "largest frame accepted from a peer",
     [](const Value& v, Config& c) { c.max_message_bytes = v.bytes(1024); }},
    {"MCCL_WIRE_DTYPE", "off", Scope::kGroup, "the type float32 payloads of reductions travel in: off, bf16, fp16",
     [](const Value& v, Config& c) { c.wire_dtype = parse_wire_type(v.text()); }},
    {"MCCL_SPIN_US", "auto", Scope::kGroup, "microseconds a waiting thread polls before it sleeps; auto: adapts",
     [](const Value& v, Config& c) {
       c.spin_auto = v.is("auto");
       c.spin_us = c.spin_auto ? 0 : static_cast<uint32_t>(v.count(0, 10'000'000));
     }},
    {"MCCL_TIMELINE_ENTRIES", "2048", Scope::kGroup, "how many of the latest collectives each group's timeline keeps",
     [](const Value& v, Config& c) { c.timeline_entries = static_cast<size_t>(v.count(0, 1'000'000)); }},
    {"MCCL_DEBUG", "WARN", Scope::kProcess, "ERROR, WARN, INFO, TRACE or 0-3; read by the logger (log.h)",
     [](const Value& v, Config&) {
       if (parse_log_level(v.text().c_str()) < 0)
         fail(Error::Kind::kInvalidArgument, "MCCL_DEBUG='", v.text(), "' is not one of ERROR, WARN, INFO, TRACE (or 0-3)");
     }},
    {"MCCL_DEVICE_IN_PLACE", "auto", Scope::kProcess, "auto: host-visible accelerator tensors in place; 0: staged",
     [](const Value& v, Config& c) { c.device_in_place = v.choice(kInPlace, "auto, 0"); }},
    {"MCCL_AUTH_SECRET", "", Scope::kGroup, "the secret every connection proves it knows, at least 16 characters",
     [](const Value& v, Config& c) {
       c.auth_secret = v.text();
       c.auth_secret_source = v.text().empty() ? "" : "MCCL_AUTH_SECRET";
     }},
    {"MCCL_AUTH_SECRET_FILE", "", Scope::kGroup, "like MCCL_AUTH_SECRET, read from this file", read_auth_secret_file},
    {"MCCL_HEARTBEAT_INTERVAL", "1", Scope::kGroup, "seconds; a peer sent nothing for this long gets a heartbeat",
     [](const Value& v, Config& c) {
       c.heartbeat_interval = v.seconds();
       if (c.heartbeat_interval.count() <= 0)
         fail(Error::Kind::kInvalidArgument, "MCCL_HEARTBEAT_INTERVAL must be positive (to disable heartbeats set "
              "MCCL_HEARTBEAT_TIMEOUT=0)");
     }},
    {"MCCL_HEARTBEAT_TIMEOUT", "30", Scope::kGroup, "seconds; a peer silent for this long fails the group; 0: off",
     [](const Value& v, Config& c) { c.heartbeat_timeout = v.seconds(); }},
};

const Variable* find_variable(const std::string& name) {
  for (const Variable& v : kVariables)
    if (name == v.name) return &v;
  return nullptr;
}

// `given`'s value, else the environment's, else the default; an empty value counts as unset.
Value value_of(const Variable& variable, const char* given) {
  const char* value = given != nullptr ? given : std::getenv(variable.name);
  return Value(variable, value != nullptr && value[0] != '\0' ? value : variable.fallback);
}

}  // namespace

const std::vector<Variable>& variables() {
  static const std::vector<Variable> all(std::begin(kVariables), std::end(kVariables));
  return all;
}

DataType parse_wire_type(const std::string& text) {
  if (text.empty()) return DataType::kFloat32;
  static const std::string listed = wire_type_names();
  return Value(*find_variable("MCCL_WIRE_DTYPE"), text).choice(kWireTypes, listed.c_str());
}

const char* wire_type_name(DataType wire) {
  for (const auto& [text, type] : kWireTypes)
    if (type == wire) return text;
  fail(Error::Kind::kInternal, "no name for wire type ", static_cast<int>(wire));
}

Config::Config() {
  for (const Variable& v : kVariables) v.read(Value(v, v.fallback), *this);
}

Config Config::from_env(const Settings& given) {
  for (const auto& setting : given)
    if (find_variable(setting.first) == nullptr)
      fail(Error::Kind::kInvalidArgument, "unknown MCCL setting '", setting.first, "' (the settings are the MCCL_* "
           "variables, e.g. MCCL_SPIN_US; see docs/settings.md)");
  Config c;
  for (const Variable& v : kVariables) {
    const auto it = given.find(v.name);
    const bool named = it != given.end();
    v.read(value_of(v, named ? it->second.c_str() : nullptr), c);
    if (named && v.scope == Variable::Scope::kProcess)
      fail(Error::Kind::kInvalidArgument, v.name, " is read once per process, from the environment, not per process "
           "group: set it in the environment of every rank (docs/settings.md)");
  }
  return c;
}

Config Config::process() {
  Config c;
  for (const Variable& v : kVariables)
    if (v.scope == Variable::Scope::kProcess) v.read(value_of(v, nullptr), c);
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
