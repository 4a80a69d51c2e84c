// The algorithm table. Each entry cites the measurement it came from (docs/settings.md, *The algorithm
// table*; `bash benchmarks/gpu_host/run.sh algos` measures sweep A again).
#include "select.h"

#include <climits>
#include <cstdint>

namespace mccl {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// `latency` runs for collectives of up to `max_bytes` on worlds of up to `max_world` ranks (the first
// matching row of the kind wins), `bandwidth` above.
struct Entry {
  CollectiveKind kind;
  int max_world;
  size_t max_bytes;
  AlgoChoice latency, bandwidth;
  const char* measured;
};

constexpr AlgoChoice kRd = AlgoChoice::kRecursiveDoubling, kRing = AlgoChoice::kRing, kTree = AlgoChoice::kTree,
                     kBruck = AlgoChoice::kBruck, kExchange = AlgoChoice::kExchange;

// Two sweeps, both loopback on the GPU host, float32, with every latency-optimal algorithm forced against
// every ring, set the entries: A, several cores per rank (4 ranks x 4 cores, 8 ranks x 2 cores, the user's
// case); B, allreduce only, 16 and 24 ranks at about one core each. Each entry is the largest size at which the
// latency algorithm was still faster; `measured` names the sweep and world size that set it. The sweeps'
// figures and commands: benchmarks/record/performance.md#the-algorithm-table.
// Above 8 ranks the other collectives keep their 8-rank entry (not measured there).
constexpr Entry kTable[] = {
    {CollectiveKind::kAllreduce, 4, 64 * KiB, kRd, kRing, "A W4"},
    {CollectiveKind::kAllreduce, 8, 128 * KiB, kRd, kRing, "A W8, capped by B W8"},
    {CollectiveKind::kAllreduce, 16, 256 * KiB, kRd, kRing, "B W16"},
    {CollectiveKind::kAllreduce, INT_MAX, 1 * MiB, kRd, kRing, "B W24"},
    {CollectiveKind::kBroadcast, 4, 512 * KiB, kTree, kRing, "A W4"},
    {CollectiveKind::kBroadcast, INT_MAX, 128 * KiB, kTree, kRing, "A W8"},
    {CollectiveKind::kReduce, 4, 256 * KiB, kTree, kRing, "A W4"},
    {CollectiveKind::kReduce, INT_MAX, 64 * KiB, kTree, kRing, "A W8"},
    {CollectiveKind::kAllgather, 4, 64 * KiB, kBruck, kRing, "A W4"},
    {CollectiveKind::kAllgather, INT_MAX, 256 * KiB, kBruck, kRing, "A W8"},
    // Recursive doubling over the whole input sends log2(n) times the input, the ring (n-1)/n of it.
    {CollectiveKind::kReduceScatter, 4, 8 * KiB, kRd, kRing, "A W4"},
    {CollectiveKind::kReduceScatter, INT_MAX, 8 * KiB, kRd, kRing, "A W8"},
};

// The 8-bit allreduce's rows (kind: the collective it is), keyed by the float32 buffer's size: the exchange up
// to max_bytes, the ring above. Its error grows with the ring's hops (docs/int8.md, *The error bound*), so a row
// should move to the ring only where the stand-in measures it faster (`run.sh int8algo`, docs/int8.md); it was
// nowhere faster on the GPU host's stand-in (benchmarks/results/h100_int8algo_8hosts), so the exchange runs.
constexpr Entry kInt8Table[] = {
    {CollectiveKind::kAllreduce, INT_MAX, SIZE_MAX, kExchange, kRing, "the exchange: the ring nowhere faster"},
};

template <size_t N>
const Entry* entry_in(const Entry (&table)[N], CollectiveKind kind, int world) {
  for (const Entry& e : table)
    if (e.kind == kind && world <= e.max_world) return &e;
  return nullptr;
}

const Entry* entry_for(CollectiveKind kind, int world) { return entry_in(kTable, kind, world); }

// The collective's forcing variable and threshold variable (config.h).
AlgoChoice forced(const Config& c, CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce: return c.algo;
    case CollectiveKind::kBroadcast: return c.broadcast_algo;
    case CollectiveKind::kReduce: return c.reduce_algo;
    case CollectiveKind::kAllgather: return c.allgather_algo;
    case CollectiveKind::kReduceScatter: return c.reduce_scatter_algo;
    default: return AlgoChoice::kAuto;
  }
}

size_t threshold_variable(const Config& c, CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce: return c.rd_max_bytes;
    case CollectiveKind::kBroadcast: return c.broadcast_tree_max_bytes;
    case CollectiveKind::kReduce: return c.reduce_tree_max_bytes;
    case CollectiveKind::kAllgather: return c.allgather_bruck_max_bytes;
    case CollectiveKind::kReduceScatter: return c.reduce_scatter_rd_max_bytes;
    default: return 0;
  }
}

}  // namespace

uint32_t selection_digest(const Config& c) {
  const uint64_t values[] = {static_cast<uint64_t>(c.broadcast_algo),       c.broadcast_tree_max_bytes,
                             static_cast<uint64_t>(c.reduce_algo),          c.reduce_tree_max_bytes,
                             static_cast<uint64_t>(c.allgather_algo),       c.allgather_bruck_max_bytes,
                             static_cast<uint64_t>(c.reduce_scatter_algo), c.reduce_scatter_rd_max_bytes,
                             static_cast<uint64_t>(c.int8_algo),           c.int8_exchange_max_bytes};
  uint32_t hash = 2166136261u;  // FNV-1a over the values' bytes
  bool defaults = true;
  for (uint64_t v : values) {
    defaults = defaults && v == 0;  // kAuto and 0 (the table) are the defaults
    for (int i = 0; i < 8; ++i) hash = (hash ^ static_cast<uint8_t>(v >> (8 * i))) * 16777619u;
  }
  return defaults ? 0 : (hash == 0 ? 1 : hash);
}

size_t latency_max_bytes(const Config& config, CollectiveKind kind, int world) {
  if (size_t set = threshold_variable(config, kind)) return set;
  const Entry* e = entry_for(kind, world);
  return e ? e->max_bytes : 0;
}

AlgoChoice select_algorithm(const Config& config, CollectiveKind kind, int world, size_t bytes, size_t count) {
  const Entry* e = entry_for(kind, world);
  if (e == nullptr) return AlgoChoice::kRing;
  if (AlgoChoice f = forced(config, kind); f != AlgoChoice::kAuto) return f;
  // The ring-based allreduce, broadcast and reduce split the buffer into one segment per rank: with
  // fewer elements than ranks the latency-optimal algorithm runs whatever the size.
  const bool segmented = kind == CollectiveKind::kAllreduce || kind == CollectiveKind::kBroadcast ||
                         kind == CollectiveKind::kReduce;
  const bool small = bytes <= latency_max_bytes(config, kind, world) || (segmented && count < size_t(world));
  return small ? e->latency : e->bandwidth;
}

AlgoChoice select_int8_algorithm(const Config& config, int world, size_t bytes) {
  if (config.int8_algo != AlgoChoice::kAuto) return config.int8_algo;
  const Entry* e = entry_in(kInt8Table, CollectiveKind::kAllreduce, world);
  const size_t up_to = config.int8_exchange_max_bytes ? config.int8_exchange_max_bytes : e->max_bytes;
  return bytes <= up_to ? e->latency : e->bandwidth;
}

}  // namespace mccl
