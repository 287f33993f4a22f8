// Escaping of script log lines (script_log.h).
#include "outrun/protocol/script_log.h"

#include <cstdint>

namespace outrun::protocol {

namespace {

// Length of the well-formed UTF-8 sequence at the start of `s` (RFC 3629: no overlongs, no
// surrogates, nothing past U+10FFFF), or 0.
std::size_t utf8_length(const unsigned char* s, std::size_t n) {
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  std::size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (n < len) return 0;
  if (s[1] < lo || s[1] > hi) return 0;
  for (std::size_t i = 2; i < len; ++i)
    if (s[i] < 0x80 || s[i] > 0xBF) return 0;
  return len;
}

bool is_control(unsigned char c) {
  return c < 0x20 || c == 0x7F;
}

}  // namespace

bool append_log_text(std::string* out, std::string_view in, std::size_t max) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* s = reinterpret_cast<const unsigned char*>(in.data());
  const std::size_t n = in.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    char esc[4];
    std::size_t esc_len = 0;
    std::size_t take = 1;
    if (is_control(c)) {
      esc[0] = '\\';
      esc_len = 2;
      if (c == '\n') {
        esc[1] = 'n';
      } else if (c == '\r') {
        esc[1] = 'r';
      } else if (c == '\t') {
        esc[1] = 't';
      } else {
        esc[1] = 'x';
        esc[2] = kHex[c >> 4];
        esc[3] = kHex[c & 15];
        esc_len = 4;
      }
    } else if (c >= 0x80) {
      take = utf8_length(s + i, n - i);
      if (take == 0) {
        take = 1;
        esc[0] = '\\';
        esc[1] = 'x';
        esc[2] = kHex[c >> 4];
        esc[3] = kHex[c & 15];
        esc_len = 4;
      }
    }
    const std::size_t add = esc_len ? esc_len : take;
    if (out->size() + add > max) return false;
    if (esc_len)
      out->append(esc, esc_len);
    else
      out->append(in.data() + i, take);
    i += take;
  }
  return true;
}

bool log_text_clean(std::string_view text, std::size_t max) {
  if (text.size() > max) return false;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    if (is_control(s[i])) return false;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    const std::size_t len = utf8_length(s + i, n - i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

}  // namespace outrun::protocol
