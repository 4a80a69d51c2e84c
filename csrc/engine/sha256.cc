#include "sha256.h"

#include <algorithm>
#include <cstring>

namespace mccl {
namespace {

// The first 32 bits of the fractional parts of the cube roots of the first 64 primes (FIPS 180-4 4.2.2).
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t load_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

inline void store_be32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}

}  // namespace

Sha256::Sha256() {
  // The first 32 bits of the fractional parts of the square roots of the first 8 primes (FIPS 180-4 5.3.3).
  const uint32_t initial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::memcpy(state_, initial, sizeof(state_));
}

// One 64-byte block: expand it to the 64-word message schedule, then 64 rounds over the working
// variables a..h, then add them into the state (FIPS 180-4 6.2.2).
void Sha256::compress(const uint8_t* block) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) w[t] = load_be32(block + 4 * t);
  for (int t = 16; t < 64; ++t) {
    uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int t = 0; t < 64; ++t) {
    uint32_t sum1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t choose = (e & f) ^ (~e & g);
    uint32_t t1 = h + sum1 + choose + kRound[t] + w[t];
    uint32_t sum0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = sum0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void* data, size_t size) {
  auto* p = static_cast<const uint8_t*>(data);
  total_bytes_ += size;
  while (size > 0) {
    size_t take = std::min(size, sizeof(block_) - block_used_);
    std::memcpy(block_ + block_used_, p, take);
    block_used_ += take;
    p += take;
    size -= take;
    if (block_used_ == sizeof(block_)) {
      compress(block_);
      block_used_ = 0;
    }
  }
}

// Padding (FIPS 180-4 5.1.1): a 1 bit, zeros up to 56 mod 64 bytes, then the message length in bits
// as a big-endian 64-bit number.
Digest Sha256::finish() {
  const uint64_t bits = total_bytes_ * 8;
  block_[block_used_++] = 0x80;
  if (block_used_ > 56) {
    std::memset(block_ + block_used_, 0, sizeof(block_) - block_used_);
    compress(block_);
    block_used_ = 0;
  }
  std::memset(block_ + block_used_, 0, 56 - block_used_);
  store_be32(block_ + 56, uint32_t(bits >> 32));
  store_be32(block_ + 60, uint32_t(bits));
  compress(block_);
  Digest out;
  for (int i = 0; i < 8; ++i) store_be32(out.data() + 4 * i, state_[i]);
  return out;
}

Digest sha256(const void* data, size_t size) {
  Sha256 h;
  h.update(data, size);
  return h.finish();
}

// HMAC(K, m) = H((K' ^ opad) || H((K' ^ ipad) || m)), K' = K padded to the block size (hashed first
// when longer than a block).
Digest hmac_sha256(const void* key, size_t key_size, const Bytes* parts, size_t part_count) {
  uint8_t padded[64] = {0};
  if (key_size > sizeof(padded)) {
    Digest hashed = sha256(key, key_size);
    std::memcpy(padded, hashed.data(), hashed.size());
  } else if (key_size > 0) {
    std::memcpy(padded, key, key_size);
  }
  uint8_t inner_pad[64], outer_pad[64];
  for (int i = 0; i < 64; ++i) {
    inner_pad[i] = padded[i] ^ 0x36;
    outer_pad[i] = padded[i] ^ 0x5c;
  }
  Sha256 inner;
  inner.update(inner_pad, sizeof(inner_pad));
  for (size_t i = 0; i < part_count; ++i) inner.update(parts[i].data, parts[i].size);
  Digest inner_digest = inner.finish();
  Sha256 outer;
  outer.update(outer_pad, sizeof(outer_pad));
  outer.update(inner_digest.data(), inner_digest.size());
  return outer.finish();
}

bool constant_time_equal(const void* a, const void* b, size_t size) {
  auto* x = static_cast<const volatile uint8_t*>(a);
  auto* y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < size; ++i) diff |= uint8_t(x[i] ^ y[i]);
  return diff == 0;
}

}  // namespace mccl
