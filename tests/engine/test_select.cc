// The algorithm table (algorithms/select.cc) and the settings that steer it, read per communicator
// from a process group's settings or the environment (config.cc). No sockets: these run in microseconds.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "algorithms/select.h"
#include "check.h"
#include "config.h"
#include "log.h"

using namespace mccl;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string error_of(const Settings& given) {
  try {
    Config::from_env(given);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

AlgoChoice pick(const Config& c, CollectiveKind kind, int world, size_t bytes) {
  return select_algorithm(c, kind, world, bytes, bytes / 4);
}

}  // namespace

// The allreduce rows follow benchmarks/results/h200_algos/ and h200x2_algo_rd_vs_ring/ (docs/settings.md).
TEST(allreduce_follows_the_measured_crossovers) {
  const Config c;
  struct Row {
    int world;
    size_t last_rd;
  } rows[] = {{2, 64 * KiB}, {4, 64 * KiB}, {8, 128 * KiB}, {16, 256 * KiB}, {24, 1 * MiB}, {64, 1 * MiB}};
  for (const Row& r : rows) {
    CHECK_MSG(pick(c, CollectiveKind::kAllreduce, r.world, r.last_rd) == AlgoChoice::kRecursiveDoubling, "world %d",
              r.world);
    CHECK_MSG(pick(c, CollectiveKind::kAllreduce, r.world, 2 * r.last_rd) == AlgoChoice::kRing, "world %d", r.world);
  }
  // Fewer elements than ranks: the ring has nothing to split, whatever the size.
  CHECK(select_algorithm(c, CollectiveKind::kAllreduce, 8, 4 * MiB, 7) == AlgoChoice::kRecursiveDoubling);
}

TEST(each_collective_has_its_own_threshold_and_forcing) {
  Config c;
  CHECK(pick(c, CollectiveKind::kBroadcast, 8, 128 * KiB) == AlgoChoice::kTree);
  CHECK(pick(c, CollectiveKind::kBroadcast, 8, 256 * KiB) == AlgoChoice::kRing);
  CHECK(pick(c, CollectiveKind::kBroadcast, 4, 512 * KiB) == AlgoChoice::kTree);
  CHECK(pick(c, CollectiveKind::kReduce, 8, 64 * KiB) == AlgoChoice::kTree);
  CHECK(pick(c, CollectiveKind::kReduce, 8, 128 * KiB) == AlgoChoice::kRing);
  CHECK(pick(c, CollectiveKind::kReduce, 4, 256 * KiB) == AlgoChoice::kTree);
  CHECK(pick(c, CollectiveKind::kAllgather, 8, 256 * KiB) == AlgoChoice::kBruck);
  CHECK(pick(c, CollectiveKind::kAllgather, 8, 512 * KiB) == AlgoChoice::kRing);
  CHECK(pick(c, CollectiveKind::kAllgather, 4, 128 * KiB) == AlgoChoice::kRing);
  CHECK(pick(c, CollectiveKind::kReduceScatter, 8, 8 * KiB) == AlgoChoice::kRecursiveDoubling);
  CHECK(pick(c, CollectiveKind::kReduceScatter, 8, 16 * KiB) == AlgoChoice::kRing);
  // The allreduce threshold no longer moves broadcast and reduce.
  c.rd_max_bytes = 4 * MiB;
  CHECK(pick(c, CollectiveKind::kBroadcast, 8, 1 * MiB) == AlgoChoice::kRing);
  CHECK(pick(c, CollectiveKind::kAllreduce, 8, 4 * MiB) == AlgoChoice::kRecursiveDoubling);
  c.broadcast_tree_max_bytes = 1 * MiB;
  CHECK(pick(c, CollectiveKind::kBroadcast, 8, 1 * MiB) == AlgoChoice::kTree);
  CHECK(pick(c, CollectiveKind::kReduce, 8, 1 * MiB) == AlgoChoice::kRing);
  c.allgather_algo = AlgoChoice::kRing;
  CHECK(pick(c, CollectiveKind::kAllgather, 8, 4 * KiB) == AlgoChoice::kRing);
  c.reduce_scatter_algo = AlgoChoice::kRecursiveDoubling;
  CHECK(pick(c, CollectiveKind::kReduceScatter, 8, 64 * MiB) == AlgoChoice::kRecursiveDoubling);
  CHECK(latency_max_bytes(c, CollectiveKind::kBroadcast, 8) == 1 * MiB);
  CHECK(latency_max_bytes(Config(), CollectiveKind::kAllreduce, 8) == 128 * KiB);
}

// The 8-bit allreduce's rows: the exchange at every size and world size until the stand-in measures the ring
// faster somewhere (docs/int8.md); the threshold moves the switch to the ring, the forcing variable pins either.
TEST(int8_allreduce_keeps_the_exchange_until_a_row_says_otherwise) {
  Config c;
  for (int world : {2, 8, 24, 64})
    for (size_t bytes : {size_t(0), 4 * KiB, 64 * MiB, size_t(1) << 40})
      CHECK_MSG(select_int8_algorithm(c, world, bytes) == AlgoChoice::kExchange, "world %d, %zu bytes", world, bytes);
  c.int8_exchange_max_bytes = 4 * MiB;
  CHECK(select_int8_algorithm(c, 8, 4 * MiB) == AlgoChoice::kExchange);
  CHECK(select_int8_algorithm(c, 8, 4 * MiB + 1) == AlgoChoice::kRing);
  c.int8_algo = AlgoChoice::kExchange;
  CHECK(select_int8_algorithm(c, 8, 64 * MiB) == AlgoChoice::kExchange);
  c.int8_algo = AlgoChoice::kRing;
  CHECK(select_int8_algorithm(c, 2, 4) == AlgoChoice::kRing);
  // The plain allreduce's settings do not move it.
  Config d;
  d.algo = AlgoChoice::kRing;
  CHECK(select_int8_algorithm(d, 8, 64 * MiB) == AlgoChoice::kExchange);
  const Config parsed = Config::from_env({{"MCCL_INT8_ALGO", "ring"}, {"MCCL_INT8_EXCHANGE_MAX_BYTES", "8M"}});
  CHECK(parsed.int8_algo == AlgoChoice::kRing && parsed.int8_exchange_max_bytes == 8 * MiB);
  const std::string e = error_of({{"MCCL_INT8_ALGO", "rd"}});
  CHECK_MSG(contains(e, "MCCL_INT8_ALGO='rd' is not one of auto, exchange, ring"), "%s", e.c_str());
}

// What the handshake compares: 0 for the defaults (so the Hello of a default rank is as before), else a
// digest that tells apart every setting.
TEST(selection_digest_tells_settings_apart) {
  CHECK(selection_digest(Config()) == 0);
  Config a, b, c;
  a.allgather_algo = AlgoChoice::kBruck;
  b.allgather_bruck_max_bytes = 4 * KiB;
  c.reduce_scatter_rd_max_bytes = 4 * KiB;
  CHECK(selection_digest(a) != 0 && selection_digest(b) != 0 && selection_digest(c) != 0);
  CHECK(selection_digest(a) != selection_digest(b) && selection_digest(b) != selection_digest(c));
  Config e, f;
  e.int8_algo = AlgoChoice::kRing;
  f.int8_exchange_max_bytes = 4 * KiB;
  CHECK(selection_digest(e) != 0 && selection_digest(f) != 0 && selection_digest(e) != selection_digest(f));
  CHECK(selection_digest(f) != selection_digest(b) && selection_digest(f) != selection_digest(c));
  Config d = b;
  CHECK(selection_digest(d) == selection_digest(b));
  d.rd_max_bytes = 1;  // allreduce's variables travel as themselves
  CHECK(selection_digest(d) == selection_digest(b));
}

TEST(selection_variables_are_parsed) {
  Config c = Config::from_env({{"MCCL_ALLGATHER_ALGO", "bruck"}, {"MCCL_REDUCE_SCATTER_ALGO", "rd"},
                               {"MCCL_BROADCAST_ALGO", "tree"}, {"MCCL_REDUCE_ALGO", "ring"},
                               {"MCCL_ALLGATHER_BRUCK_MAX_BYTES", "2M"}, {"MCCL_REDUCE_TREE_MAX_BYTES", "8K"}});
  CHECK(c.allgather_algo == AlgoChoice::kBruck && c.reduce_scatter_algo == AlgoChoice::kRecursiveDoubling);
  CHECK(c.broadcast_algo == AlgoChoice::kTree && c.reduce_algo == AlgoChoice::kRing);
  CHECK(c.allgather_bruck_max_bytes == 2 * MiB && c.reduce_tree_max_bytes == 8 * KiB);
  const std::string e = error_of({{"MCCL_ALLGATHER_ALGO", "rd"}});
  CHECK_MSG(contains(e, "MCCL_ALLGATHER_ALGO='rd' is not one of auto, ring, bruck"), "%s", e.c_str());
}

// A group's settings take the place of the environment's; the environment is read when the group's
// communicator is made, so a change applies to the next one.
TEST(group_settings_override_the_environment_and_later_changes_apply) {
  ::setenv("MCCL_SPIN_US", "7", 1);
  CHECK(Config::from_env().spin_us == 7);
  CHECK(Config::from_env({{"MCCL_SPIN_US", "0"}}).spin_us == 0);
  ::setenv("MCCL_SPIN_US", "9", 1);
  CHECK(Config::from_env().spin_us == 9);
  ::unsetenv("MCCL_SPIN_US");
  const std::string e = error_of({{"MCCL_SPINUS", "0"}});
  CHECK_MSG(contains(e, "unknown MCCL setting 'MCCL_SPINUS'"), "%s", e.c_str());
}

TEST(counts_reject_byte_suffixes) {
  for (const char* name : {"MCCL_NSOCKS", "MCCL_SPIN_US"}) {
    for (const char* bad : {"2K", "1M", "-1", "two", "1.5"}) {
      const std::string e = error_of({{name, bad}});
      CHECK_MSG(contains(e, std::string(name) + "='" + bad + "' is not a whole number"), "%s=%s: %s", name, bad,
                e.c_str());
    }
  }
  CHECK_MSG(contains(error_of({{"MCCL_NSOCKS", "17"}}), "MCCL_NSOCKS=17 is outside 1-16"), "%s",
            error_of({{"MCCL_NSOCKS", "17"}}).c_str());
  CHECK(Config::from_env({{"MCCL_NSOCKS", "3"}}).nsocks == 3);
  CHECK(Config::from_env({{"MCCL_CHUNK_BYTES", "64K"}}).chunk_bytes == 64 * KiB);  // bytes still take suffixes
}

// Byte counts past 2^64 - 1, as written (strtoull's range) or once scaled by their suffix, are errors naming
// the variable rather than wrapped values; so is a socket buffer past the int the socket options take.
TEST(byte_counts_that_do_not_fit_are_rejected) {
  for (const char* bad : {"18446744073709551616", "99999999999999999999999", "17179869184G", "18014398509481984K"}) {
    const std::string e = error_of({{"MCCL_RING_LOOKAHEAD_BYTES", bad}});
    CHECK_MSG(contains(e, std::string("MCCL_RING_LOOKAHEAD_BYTES='") + bad + "' is too large"), "%s: %s", bad,
              e.c_str());
  }
  CHECK(Config::from_env({{"MCCL_MAX_MESSAGE_BYTES", "18446744073709551615"}}).max_message_bytes == UINT64_MAX);
  CHECK(Config::from_env({{"MCCL_MAX_MESSAGE_BYTES", "17179869183G"}}).max_message_bytes == 17179869183ull << 30);
  const std::string e = error_of({{"MCCL_SOCKET_BUFFER_BYTES", "2G"}});
  CHECK_MSG(contains(e, "MCCL_SOCKET_BUFFER_BYTES=2147483648 is larger than 2147483647"), "%s", e.c_str());
  CHECK(Config::from_env({{"MCCL_SOCKET_BUFFER_BYTES", "2147483647"}}).socket_buffer_bytes == 2147483647u);
}

// MCCL_REDUCE_THREADS: auto leaves two CPUs of a rank's share to its progress and sender threads, 1-4 forced.
TEST(reduce_threads_auto_and_forced) {
  const Config automatic = Config::from_env({{"MCCL_REDUCE_THREADS", "auto"}});
  CHECK(automatic.reduce_threads_for(1, 20) == 4);  // a Mac Studio running one rank
  CHECK(automatic.reduce_threads_for(4, 16) == 2);
  CHECK(automatic.reduce_threads_for(8, 16) == 1 && automatic.reduce_threads_for(2, 2) == 1);
  CHECK(Config::from_env({{"MCCL_REDUCE_THREADS", "3"}}).reduce_threads_for(8, 16) == 3);
  const std::string e = error_of({{"MCCL_REDUCE_THREADS", "5"}});
  CHECK_MSG(contains(e, "MCCL_REDUCE_THREADS=5 is outside 1-4"), "%s", e.c_str());
  CHECK_MSG(contains(error_of({{"MCCL_REDUCE_THREADS", "2K"}}), "is not a whole number"), "2K");
}

// The logger reads MCCL_DEBUG alone: a bad secret file or another bad variable cannot break logging.
TEST(logging_reads_only_its_own_variable) {
  CHECK(parse_log_level("INFO") == 2 && parse_log_level("0") == 0 && parse_log_level("LOUD") == -1);
  ::setenv("MCCL_AUTH_SECRET_FILE", "/nonexistent/mccl-secret", 1);
  ::setenv("MCCL_NSOCKS", "2K", 1);
  const char* debug = std::getenv("MCCL_DEBUG");
  CHECK(log_level() == (debug && parse_log_level(debug) >= 0 ? parse_log_level(debug) : 1));
  log(LogLevel::kTrace, "not printed");
  ::unsetenv("MCCL_AUTH_SECRET_FILE");
  ::unsetenv("MCCL_NSOCKS");
  const std::string e = error_of({{"MCCL_DEBUG", "LOUD"}});
  CHECK_MSG(contains(e, "MCCL_DEBUG='LOUD' is not one of ERROR, WARN, INFO, TRACE"), "%s", e.c_str());
}

// MCCL_DEBUG and MCCL_DEVICE_IN_PLACE are read once per process from the environment (process()): a group's
// settings naming one are refused (after their value is checked), and a bad value in the environment fails
// the group too.
TEST(per_process_variables_are_not_group_settings) {
  CHECK(Config().device_in_place && Config::from_env({}).device_in_place);
  std::string e = error_of({{"MCCL_DEVICE_IN_PLACE", "0"}});
  CHECK_MSG(contains(e, "MCCL_DEVICE_IN_PLACE is read once per process, from the environment"), "%s", e.c_str());
  e = error_of({{"MCCL_DEVICE_IN_PLACE", "sometimes"}});
  CHECK_MSG(contains(e, "MCCL_DEVICE_IN_PLACE='sometimes' is not one of auto, 0"), "%s", e.c_str());
  ::setenv("MCCL_DEVICE_IN_PLACE", "0", 1);
  CHECK(!Config::process().device_in_place && !Config::from_env().device_in_place);
  ::setenv("MCCL_DEVICE_IN_PLACE", "never", 1);
  e = error_of({});
  CHECK_MSG(contains(e, "MCCL_DEVICE_IN_PLACE='never' is not one of auto, 0"), "%s", e.c_str());
  ::unsetenv("MCCL_DEVICE_IN_PLACE");
  CHECK(Config::process().device_in_place);
}

// Every wire type has one usual name (what the binding's wire_type() and a group's wire_dtype say); the
// synonyms and unset mean the same types.
TEST(wire_types_parse_to_their_usual_names) {
  CHECK(parse_wire_type("") == DataType::kFloat32 && parse_wire_type("none") == DataType::kFloat32);
  CHECK(parse_wire_type("bfloat16") == DataType::kBFloat16 && parse_wire_type("half") == DataType::kFloat16);
  CHECK(std::string(wire_type_name(DataType::kFloat32)) == "off");
  CHECK(std::string(wire_type_name(parse_wire_type("float16"))) == "fp16");
  CHECK(Config::from_env({{"MCCL_WIRE_DTYPE", "bfloat16"}}).wire_dtype == DataType::kBFloat16);
  const std::string e = error_of({{"MCCL_WIRE_DTYPE", "BF16"}});
  CHECK_MSG(contains(e, "MCCL_WIRE_DTYPE='BF16' is not one of off, bf16, fp16"), "%s", e.c_str());
}

// MCCL_ALLTOALL_WINDOW (a count: rounds in flight, 0 for every peer at once) and MCCL_ALLTOALL_WINDOW_GATE.
TEST(window_settings_are_parsed) {
  CHECK(Config().alltoall_window == 0 && !Config().alltoall_gate_send);
  const Config c = Config::from_env({{"MCCL_ALLTOALL_WINDOW", "4"}, {"MCCL_ALLTOALL_WINDOW_GATE", "send"}});
  CHECK(c.alltoall_window == 4 && c.alltoall_gate_send);
  CHECK(!Config::from_env({{"MCCL_ALLTOALL_WINDOW_GATE", "both"}}).alltoall_gate_send);
  for (const char* bad : {"-1", "two", "2K", "1.5"}) {
    const std::string e = error_of({{"MCCL_ALLTOALL_WINDOW", bad}});
    CHECK_MSG(contains(e, std::string("MCCL_ALLTOALL_WINDOW='") + bad + "' is not a whole number"), "%s: %s", bad,
              e.c_str());
  }
  std::string e = error_of({{"MCCL_ALLTOALL_WINDOW", "1000001"}});
  CHECK_MSG(contains(e, "MCCL_ALLTOALL_WINDOW=1000001 is outside 0-1000000"), "%s", e.c_str());
  e = error_of({{"MCCL_ALLTOALL_WINDOW_GATE", "recv"}});
  CHECK_MSG(contains(e, "MCCL_ALLTOALL_WINDOW_GATE='recv' is not one of both, send"), "%s", e.c_str());
}

// The table's defaults are what a Config starts with, and each is a value its own parser takes.
TEST(every_variable_takes_its_default) {
  CHECK(Config().chunk_bytes == 512 * KiB && Config().ring_lookahead_bytes == 64 * MiB);
  CHECK(Config().max_message_bytes == uint64_t(64) << 30 && Config().heartbeat_timeout.count() == 30000);
  CHECK(Config().send_thread_auto && Config().send_thread_bytes == 512 * KiB && Config().reduce_threads == 0);
  for (const Variable& v : variables()) {
    if (v.scope == Variable::Scope::kGroup) {
      const std::string e = error_of({{v.name, v.fallback}});
      CHECK_MSG(e.empty(), "%s=%s: %s", v.name, v.fallback, e.c_str());
    }
  }
}

MCCL_TEST_MAIN
