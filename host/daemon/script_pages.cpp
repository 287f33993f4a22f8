#include "script_pages.h"

#include "outrun/runner.h"

namespace outrun::daemon {

std::string encode_cursor(std::string_view key, uint32_t skip) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(2 * key.size() + 11);
  for (unsigned char c : key) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  s += ':';
  s += std::to_string(skip);
  return s;
}

bool decode_cursor(std::string_view s, PageCursor* out) {
  *out = PageCursor{};
  if (s.empty()) return true;
  const std::size_t colon = s.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon % 2 != 0 || colon > 2 * kMaxKeySize)
    return false;
  auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < colon; i += 2) {
    const int hi = nibble(s[i]), lo = nibble(s[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->key += static_cast<char>(hi << 4 | lo);
  }
  const std::string_view n = s.substr(colon + 1);
  if (n.empty() || n.size() > 10) return false;
  uint64_t v = 0;
  for (char c : n) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > UINT32_MAX) return false;
  out->skip = static_cast<uint32_t>(v);
  return true;
}

}  // namespace outrun::daemon
