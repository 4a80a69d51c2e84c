// Which algorithm each collective runs: one table (select.cc), one function.
//
// Every collective with a choice has a latency-optimal algorithm (few steps, more bytes) and a
// bandwidth-optimal one (the ring: few bytes, n-1 steps). `auto` runs the latency-optimal one up to
// a size threshold, the ring above it. Each threshold has its own variable (0, the default: the
// table's entry for this world size) and each collective its own forcing variable, so every choice
// can be measured (`bash benchmarks/gpu_host/run.sh algos`, docs/settings.md) and pinned:
//
//   collective      forcing variable (values)                   threshold variable
//   allreduce       MCCL_ALGO (auto, ring, rd)                  MCCL_RD_MAX_BYTES
//   broadcast       MCCL_BROADCAST_ALGO (auto, tree, ring)      MCCL_BROADCAST_TREE_MAX_BYTES
//   reduce          MCCL_REDUCE_ALGO (auto, tree, ring)         MCCL_REDUCE_TREE_MAX_BYTES
//   allgather       MCCL_ALLGATHER_ALGO (auto, ring, bruck)     MCCL_ALLGATHER_BRUCK_MAX_BYTES
//   reduce_scatter  MCCL_REDUCE_SCATTER_ALGO (auto, ring, rd)   MCCL_REDUCE_SCATTER_RD_MAX_BYTES
//   8-bit allreduce MCCL_INT8_ALGO (auto, exchange, ring)       MCCL_INT8_EXCHANGE_MAX_BYTES
//
// The 8-bit allreduce (docs/int8.md) has its own rows: the reduce-once exchange (two rounds, every rank sending
// to every other at once) up to the threshold, the ring (2(n-1) steps, one flow in and one out) above; both send
// the same bytes.
// Sizes are counted as nccl-tests (and benchmarks/allreduce.py) count them: the buffer for allreduce,
// broadcast and reduce, the gathered output for allgather, the input for reduce-scatter.
#pragma once

#include <cstddef>

#include "../config.h"
#include "../wire.h"

namespace mccl {

// The algorithm `kind` runs on `world` ranks for a collective of `bytes` (counted as above) and
// `count` elements per rank. Never kAuto. Only allreduce, broadcast, reduce, allgather and
// reduce_scatter have a choice; the other kinds get kRing (unused).
AlgoChoice select_algorithm(const Config& config, CollectiveKind kind, int world, size_t bytes, size_t count);

// The 8-bit allreduce's algorithm (kExchange or kRing) on `world` ranks for a float32 buffer of `bytes`.
AlgoChoice select_int8_algorithm(const Config& config, int world, size_t bytes);

// A 32-bit digest of the forcing and threshold variables of broadcast, reduce, allgather, reduce_scatter
// and the 8-bit allreduce, compared when ranks connect (MCCL_ALGO and MCCL_RD_MAX_BYTES travel as themselves);
// 0 when all are at their defaults. Ranks that chose differently would post mismatched frames.
uint32_t selection_digest(const Config& config);

// The size up to which `auto` picks the latency-optimal algorithm: the threshold variable when set,
// else the table's entry for `world` ranks.
size_t latency_max_bytes(const Config& config, CollectiveKind kind, int world);

}  // namespace mccl
