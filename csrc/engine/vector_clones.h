// MCCL_TARGET_CLONES: the attribute that gives an element loop an AVX2 and a baseline clone.
//
// Runtime SIMD selection on x86-64 Linux with g++: each kernel gets an AVX2 clone and a baseline clone,
// chosen once by an ifunc resolver. On arm64 NEON is the baseline: the same loops compile to NEON code
// (float16 through the hardware conversions, see reduce_kernels.h), checked by `make test-arm64`. Elsewhere
// (clang on x86) the loops are vectorised for the baseline (SSE2).
// Not under -fsanitize=thread: g++ instruments the resolver, which runs before TSan is initialised and crashes.
#pragma once

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define MCCL_TARGET_CLONES __attribute__((target_clones("avx2", "default")))
#define MCCL_HAVE_TARGET_CLONES 1
#else
#define MCCL_TARGET_CLONES
#define MCCL_HAVE_TARGET_CLONES 0
#endif
