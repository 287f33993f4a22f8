// The Windows build's stand-in for <openssl/sha.h> (no MinGW OpenSSL in Debian): OpenSSL's
// one-shot SHA256(), the only OpenSSL call outrun makes (host/src/script_registry.cpp), on
// Windows' BCrypt (sha256_bcrypt.cpp). Same signature and result: the 32-byte digest in `md`.
#pragma once

#include <cstddef>

#define SHA256_DIGEST_LENGTH 32

extern "C" unsigned char* SHA256(const unsigned char* d, std::size_t n, unsigned char* md);
