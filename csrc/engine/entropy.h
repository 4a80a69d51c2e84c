// Unpredictable bytes from the operating system, for the job secret and the handshake nonces.
#pragma once

#include <cstddef>

namespace mccl {

// Fills `out` from getentropy() (Linux glibc >= 2.25, macOS >= 10.12), else /dev/urandom.
// Throws kInternal when neither works: never falls back to a predictable source.
void random_bytes(void* out, size_t size);

}  // namespace mccl
