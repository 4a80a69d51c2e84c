// SHA-256 and HMAC-SHA256 (sha256.h, the job secret's proofs) against published vectors.
#include <cstdio>
#include <string>

#include "check.h"
#include "sha256.h"

using namespace mccl;

namespace {

std::string hex(const Digest& d) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::string unhex(const std::string& text) {
  std::string out;
  for (size_t i = 0; i + 1 < text.size(); i += 2) out += static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16));
  return out;
}

std::string hmac_hex(const std::string& key, const std::string& data) {
  Bytes part{data.data(), data.size()};
  return hex(hmac_sha256(key.data(), key.size(), &part, 1));
}

}  // namespace

TEST(sha256_matches_fips_180_4_examples) {
  CHECK(hex(sha256("abc", 3)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(sha256("", 0)) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  CHECK(hex(sha256(two_blocks.data(), two_blocks.size())) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces to exercise the block buffering.
  Sha256 h;
  std::string piece(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    size_t n = std::min(left, piece.size());
    h.update(piece.data(), n);
    left -= n;
  }
  CHECK(hex(h.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the padding boundary, against Python's hashlib.sha256(b"x" * n).
  const std::pair<size_t, const char*> boundary[] = {
      {55, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072"},
      {56, "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e"},
      {63, "75220b47218278e656f2013bb8f0c455a25eaf01e86c64924e9d48d89776d6f2"},
      {64, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"},
      {65, "9537c5fdf120482f7d58d25e9ed583f52c02b4e304ea814db1633ad565aed7e9"}};
  for (const auto& [n, expected] : boundary) {
    std::string x(n, 'x');
    CHECK_MSG(hex(sha256(x.data(), n)) == expected, "sha256 of %zu bytes", n);
  }
}

TEST(hmac_sha256_matches_rfc_4231) {
  // Test cases 1, 2, 3, 4, 6 and 7 of RFC 4231 (5 is a truncated output).
  CHECK(hmac_hex(std::string(20, '\x0b'), "Hi There") ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hmac_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hmac_hex(std::string(20, '\xaa'), std::string(50, '\xdd')) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  CHECK(hmac_hex(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd')) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  CHECK(hmac_hex(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First") ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(hmac_hex(std::string(131, '\xaa'),
                 "This is a test using a larger than block-size key and a larger than block-size data. The key "
                 "needs to be hashed before being used by the HMAC algorithm.") ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // The parts are concatenated.
  std::string key = "Jefe";
  Bytes parts[] = {{"what do ya ", 11}, {"want for nothing?", 17}};
  CHECK(hex(hmac_sha256(key.data(), key.size(), parts, 2)) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(constant_time_equal("abcd", "abcd", 4));
  CHECK(!constant_time_equal("abcd", "abce", 4));
}

MCCL_TEST_MAIN
