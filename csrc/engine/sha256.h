// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the connection handshake's proofs.
//
// Small and dependency-free on purpose: macOS ships no OpenSSL headers, and the handshake hashes a
// few hundred bytes per connection, so speed does not matter. Tested against the FIPS 180-4 examples
// and the RFC 4231 HMAC vectors (tests/engine/test_auth.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace mccl {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  Digest finish();  // the object must not be used afterwards

 private:
  void compress(const uint8_t* block);

  uint32_t state_[8];
  uint8_t block_[64];
  size_t block_used_ = 0;
  uint64_t total_bytes_ = 0;
};

Digest sha256(const void* data, size_t size);

// HMAC-SHA256 over the concatenation of `parts` (pointer, size pairs), keyed by `key`.
struct Bytes {
  const void* data;
  size_t size;
};
Digest hmac_sha256(const void* key, size_t key_size, const Bytes* parts, size_t part_count);

// Compares without an early exit, so the time taken does not reveal how many leading bytes match.
bool constant_time_equal(const void* a, const void* b, size_t size);

}  // namespace mccl
