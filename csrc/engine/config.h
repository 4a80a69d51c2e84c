// Every MCCL_* variable, declared once: its name, its default, its parser and a line of documentation are
// one row of the table in config.cc (`variables()`). A process group reads its variables when its
// communicator is made: from the settings it was given (backend options), else the environment
// (docs/settings.md). tests/docs/test_settings_docs.py checks docs/settings.md's and the README's tables
// against the table.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dtype.h"

namespace mccl {

// A collective's algorithm (algorithms/select.h); the numbers travel in the handshake (MCCL_ALGO).
enum class AlgoChoice : uint8_t { kAuto = 0, kRing = 1, kRecursiveDoubling = 2, kTree = 3, kBruck = 4, kExchange = 5 };

// MCCL_REDUCE_THREADS' maximum: the reduction pool (reduce_pool.cc) splits one piece's work into at most
// this many parts, the calling thread's and those of kMaxReduceThreads - 1 workers.
constexpr size_t kMaxReduceThreads = 4;

// Settings given to one process group, by variable name ("MCCL_SPIN_US" -> "0"); they take the place of
// the environment's values.
using Settings = std::map<std::string, std::string>;

// A process group's settings: one member per variable (some take two), each at the value the variable says
// or at its declared default (config.cc's table). The comments say what each is; the table says how it is
// written and what it defaults to.
struct Config {
  Config();  // every variable at its default

  // MCCL_SOCKET_IFNAME: network interface whose IPv4/IPv6 address this rank listens on (like GLOO_SOCKET_IFNAME).
  // Empty: the interface that routes to MASTER_ADDR, else loopback.
  std::string socket_ifname;
  // MCCL_PORT_RANGE: "LOW-HIGH" (e.g. 29600-29700): the only ports a rank's listener binds (the lowest free
  // one; a rank listens only while connecting), so a firewall can allow exactly them. 0-0 (unset): any
  // ephemeral port the OS picks.
  uint16_t port_min;
  uint16_t port_max;
  // Algorithm selection (algorithms/select.h): per collective, a forcing variable (auto, the default,
  // follows the table in algorithms/select.cc) and the size up to which auto runs the latency-optimal
  // algorithm (0, the default: the table's entry for the world size).
  // MCCL_ALGO: auto | ring | rd (recursive doubling), and MCCL_RD_MAX_BYTES: allreduce.
  AlgoChoice algo;
  size_t rd_max_bytes;
  // MCCL_BROADCAST_ALGO: auto | tree (binomial) | ring (scatter, then ring all-gather); MCCL_BROADCAST_TREE_MAX_BYTES.
  AlgoChoice broadcast_algo;
  size_t broadcast_tree_max_bytes;
  // MCCL_REDUCE_ALGO: auto | tree (binomial) | ring (ring reduce-scatter, then gather); MCCL_REDUCE_TREE_MAX_BYTES.
  AlgoChoice reduce_algo;
  size_t reduce_tree_max_bytes;
  // MCCL_ALLGATHER_ALGO: auto | ring | bruck; MCCL_ALLGATHER_BRUCK_MAX_BYTES (the gathered size).
  AlgoChoice allgather_algo;
  size_t allgather_bruck_max_bytes;
  // MCCL_REDUCE_SCATTER_ALGO: auto | ring | rd; MCCL_REDUCE_SCATTER_RD_MAX_BYTES (the input size).
  AlgoChoice reduce_scatter_algo;
  size_t reduce_scatter_rd_max_bytes;
  // MCCL_INT8_ALGO: auto | exchange (reduce-once) | ring, the 8-bit allreduce's (docs/int8.md);
  // MCCL_INT8_EXCHANGE_MAX_BYTES (the float32 buffer's size): up to it auto runs the exchange, the ring above.
  AlgoChoice int8_algo;
  size_t int8_exchange_max_bytes;
  // MCCL_ALLTOALL_WINDOW: the all-to-all's schedule (algorithms/exchange.cc). 0: every receive posted, then a
  // send to every peer at once; W >= 1: the pairwise exchange, n-1 rounds of one send and one receive, W rounds
  // in flight. MCCL_ALLTOALL_WINDOW_GATE: what lets round i+W start: round i's send and receive done (both), or
  // its send alone (send, alltoall_gate_send). The schedule changes no frame, so ranks may differ. Its default, 0,
  // is the A/B's choice at 8 hosts, 4-256 MiB: no window faster in every run, all slower from 32 MiB up
  // (benchmarks/results/h100_stagger_8hosts).
  size_t alltoall_window;
  bool alltoall_gate_send;
  // MCCL_CHUNK_BYTES: pipelining granularity of the ring (each ring step moves its segment in such pieces),
  // in bytes on the wire: a compressed float32 piece holds chunk_bytes / 2 elements.
  size_t chunk_bytes;
  // MCCL_NSOCKS: TCP connections ("lanes") between every two ranks, 1-16. Each frame's payload is split
  // across them in shares of at least 16 KiB (transport/peer.h), with a sender thread per lane index when
  // sender threads are on, so several cores copy into the kernel at once and a link that limits each flow
  // is used by several. Must be the same on every rank (checked when connecting); so must
  // MCCL_CHUNK_BYTES (not checked there: a difference is a mismatch at the first multi-piece collective).
  int nsocks;
  // MCCL_RING_LOOKAHEAD_BYTES: scratch memory the ring reduce-scatter may use to post receives for
  // later steps early (at least a double buffer is always used).
  size_t ring_lookahead_bytes;
  // MCCL_SOCKET_BUFFER_BYTES: SO_SNDBUF / SO_RCVBUF for data connections, at most 2 GiB - 1 (the options
  // take an int); 0 keeps the OS default (autotuning).
  size_t socket_buffer_bytes;
  // MCCL_MAX_MESSAGE_BYTES: largest frame payload accepted from a peer before any allocation.
  uint64_t max_message_bytes;
  // MCCL_WIRE_DTYPE: off | bf16 | fp16. Float32 payloads of reductions (allreduce, reduce-scatter, reduce)
  // travel in this type (half the bytes), rounded to nearest even; kFloat32 means off. The other
  // collectives and point-to-point send/recv are never compressed.
  DataType wire_dtype;
  // MCCL_SPIN_US: how long a waiting thread keeps polling (yielding the CPU between polls) before it
  // sleeps: the progress thread waiting for a peer's frame or for the next collective, a caller waiting on
  // a collective, a sender thread waiting for frames. Saves thread wake-ups on every small collective.
  // Unset (or "auto", spin_auto): each waiting site adapts its own spin (spin.h); a number fixes it; 0:
  // always sleep.
  uint32_t spin_us;
  bool spin_auto;
  // MCCL_TIMELINE_ENTRIES: how many of the latest collectives the communicator's timeline (timeline.h)
  // keeps, with their issue, start, ready and completion times; 0 records none.
  size_t timeline_entries;
  // MCCL_SEND_THREAD_BYTES: frames with at least this many payload bytes are written by their lane's sender
  // thread (one per lane index, shared by the peers), so sending overlaps receiving and reducing on the progress thread; 0: one thread
  // does all socket I/O. Unset (or "auto"): 512 KiB when this host has at least 4 CPUs per rank on it
  // (send_thread_auto), else 0: with fewer, the extra thread competes with the ranks for cores.
  size_t send_thread_bytes;
  bool send_thread_auto;
  // The setting for a rank that shares its host with `local_ranks` ranks (counting itself) and `cpus`.
  size_t send_thread_bytes_for(int local_ranks, unsigned cpus) const;
  // MCCL_REDUCE_THREADS: 1 to kMaxReduceThreads threads share the element-wise work of one piece: the
  // progress thread and workers of the reduction pool (reduce_pool.h). It covers the widening, reduction
  // and narrowing of compressed pieces (MCCL_WIRE_DTYPE), most of the progress thread's work there, and
  // reductions of 4 MiB or more; 1: the progress thread alone. Unset (or "auto", 0 here): this rank's CPUs
  // less two (for its progress and sender threads), between 1 and kMaxReduceThreads (reduce_threads_for).
  size_t reduce_threads;
  size_t reduce_threads_for(int local_ranks, unsigned cpus) const;
  // MCCL_DEBUG (log.h) is read by the logger alone, once per process; from_env only checks its value.
  // MCCL_DEVICE_IN_PLACE: auto (true): accelerator tensors the CPU can address are read and written in
  // place; 0: staged through host buffers (csrc/torch/host_memory.hpp). Read once per process (process()).
  bool device_in_place;
  // MCCL_AUTH_SECRET, or the contents of the file MCCL_AUTH_SECRET_FILE (trailing whitespace removed):
  // the secret every connection proves it knows. Empty: rank 0 makes a random one per communicator
  // and hands it out through the Store (which protects against other jobs and blind scanners, not
  // against someone who can read the Store). Must be the same on every host when set.
  std::string auth_secret;
  std::string auth_secret_source;  // which variable it came from, for messages
  // MCCL_HEARTBEAT_INTERVAL (seconds): a peer that has been sent nothing for this long gets a
  // heartbeat frame (at least 4 per MCCL_HEARTBEAT_TIMEOUT).
  std::chrono::milliseconds heartbeat_interval;
  // MCCL_HEARTBEAT_TIMEOUT (seconds): a peer that sent nothing for this long (it is stopped, asleep or
  // unreachable) fails the communicator, also between collectives. 0 disables.
  std::chrono::milliseconds heartbeat_timeout;

  // The environment, with `given` (a process group's backend options) in place of the variables it
  // names. Throws kInvalidArgument naming the variable for a bad value, an unknown name, or a variable
  // read once per process (MCCL_DEBUG, MCCL_DEVICE_IN_PLACE) among `given`; their values in the
  // environment are checked too.
  static Config from_env(const Settings& given = {});
  static const Config& global();  // from_env() evaluated once per process (engine tests and tools)
  // The variables read once per process, from the environment; the others at their defaults. The binding
  // reads MCCL_DEVICE_IN_PLACE from it once (the logger reads MCCL_DEBUG itself: log.h).
  static Config process();
};

class Value;  // one variable's value as a parser sees it (config.cc)

// One row of the table of variables (config.cc): everything about one MCCL_* variable.
struct Variable {
  enum class Scope { kGroup, kProcess };  // read when a process group is made, or once per process
  const char* name;
  const char* fallback;  // the default, as the variable would be written ("" for unset); as the docs show it
  Scope scope;
  const char* doc;  // a line for the docs' tables
  void (*read)(const Value& value, Config& config);  // parses the value into `config`, or throws
};
// The table, in the order of docs/settings.md's.
const std::vector<Variable>& variables();

// MCCL_WIRE_DTYPE's values: "off" (kFloat32; also "" and the synonyms of config.cc's table), "bf16", "fp16".
// parse_wire_type throws kInvalidArgument naming the variable for any other text; wire_type_name gives a
// wire type's usual name, the one the first of the table's rows for it has.
DataType parse_wire_type(const std::string& text);
const char* wire_type_name(DataType wire);

}  // namespace mccl
