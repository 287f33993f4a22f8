// The BCrypt SHA256() of the Windows build (sha256_bcrypt.cpp) against FIPS 180-2's test vectors.
#include <doctest/doctest.h>
#include <openssl/sha.h>

#include <cstdio>
#include <string>

namespace {

std::string hex_sha256(const std::string& s) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), md);
  std::string out;
  char b[3];
  for (unsigned char c : md) {
    std::snprintf(b, sizeof b, "%02x", c);
    out += b;
  }
  return out;
}

}  // namespace

TEST_CASE("windows: SHA256 on BCrypt gives the FIPS 180-2 digests") {
  CHECK(hex_sha256("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex_sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex_sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex_sha256(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
