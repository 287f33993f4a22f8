// Paging of outrund's ListScripts (design/protocol.md "Paged ListScripts"): the limits of one page
// and its cursor. Scripts are listed by key (byte order), a key's handles in the order they were
// given out; a cursor names where the next page starts: a key (hex of its bytes) and how many of
// that key's handles the earlier pages listed. Opaque to clients.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace outrun::daemon {

inline constexpr uint32_t kDefaultPageScripts = 1000;  // Control.limit 0
inline constexpr uint32_t kMaxPageScripts = 10000;     // a larger Control.limit is read as this
// A page's document stops before it would pass this (at least one script per page: one is at most
// a few KiB), far below kMaxFrameSize whatever the keys.
inline constexpr std::size_t kMaxPageBytes = std::size_t{4} << 20;

struct PageCursor {
  std::string key;    // empty: the first page
  uint32_t skip = 0;  // handles of `key` already listed
};

// "HEX:SKIP", HEX the key's bytes in lower-case hex.
std::string encode_cursor(std::string_view key, uint32_t skip);
// False for anything encode_cursor cannot have made (the empty string is the first page).
bool decode_cursor(std::string_view s, PageCursor* out);

}  // namespace outrun::daemon
