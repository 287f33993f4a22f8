// SHA-256 on Windows' CNG (BCrypt): the implementation of include/openssl/sha.h's SHA256().
#include "openssl/sha.h"

// clang-format off
#include <windows.h>
#include <bcrypt.h>
// clang-format on

#include <cstdio>
#include <cstdlib>

namespace {

[[noreturn]] void fail(const char* what, NTSTATUS st) {
  // A digest that silently differed would merge distinct scripts in the registry: stop instead.
  std::fprintf(stderr, "outrun: BCrypt %s failed (NTSTATUS 0x%08lx)\n", what,
               static_cast<unsigned long>(st));
  std::abort();
}

// The algorithm provider, opened once (a thread-safe static) and never closed.
BCRYPT_ALG_HANDLE provider() {
  static const BCRYPT_ALG_HANDLE alg = [] {
    BCRYPT_ALG_HANDLE h = nullptr;
    const NTSTATUS st = BCryptOpenAlgorithmProvider(&h, BCRYPT_SHA256_ALGORITHM, nullptr, 0);
    if (!BCRYPT_SUCCESS(st)) fail("BCryptOpenAlgorithmProvider(SHA256)", st);
    return h;
  }();
  return alg;
}

}  // namespace

extern "C" unsigned char* SHA256(const unsigned char* d, std::size_t n, unsigned char* md) {
  BCRYPT_HASH_HANDLE h = nullptr;
  NTSTATUS st = BCryptCreateHash(provider(), &h, nullptr, 0, nullptr, 0, 0);
  if (!BCRYPT_SUCCESS(st)) fail("BCryptCreateHash", st);
  // BCryptHashData takes a ULONG length: feed larger inputs in pieces.
  constexpr std::size_t kChunk = 1u << 30;
  do {
    const std::size_t len = n < kChunk ? n : kChunk;
    st = BCryptHashData(h, const_cast<PUCHAR>(d), static_cast<ULONG>(len), 0);
    if (!BCRYPT_SUCCESS(st)) fail("BCryptHashData", st);
    d += len;
    n -= len;
  } while (n > 0);
  st = BCryptFinishHash(h, md, SHA256_DIGEST_LENGTH, 0);
  if (!BCRYPT_SUCCESS(st)) fail("BCryptFinishHash", st);
  BCryptDestroyHash(h);
  return md;
}
