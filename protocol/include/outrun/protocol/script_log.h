// What a script may log during one evaluation (print(...), log.debug/info/warn/error(...)) and how
// a line's text is made safe to show: shared by the worker, which records the lines, and by
// everything that receives them (the host, outrund, the clients), which do not trust a line's
// bytes (design/sandbox.md "Script logs").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace outrun::protocol {

// Per evaluation: lines kept, bytes of one line, bytes of all its lines. What is past them is
// counted in Result.logs_dropped, not kept.
inline constexpr std::size_t kMaxLogLinesPerEvaluation = 16;
inline constexpr std::size_t kMaxLogLineBytes = 256;
inline constexpr std::size_t kMaxLogBytesPerEvaluation = 2048;

// Appends `in` to `out`, escaping what a terminal or a log file must not get raw: control
// characters as \n, \r, \t or \xNN, and bytes that are not well-formed UTF-8 as \xNN. Stops
// before `out` would pass `max` bytes (an escape or a character is never cut in two). Returns
// false when part of `in` did not fit. Allocates only if `out`'s capacity is below `max`.
bool append_log_text(std::string* out, std::string_view in, std::size_t max);

// True when `text` is what append_log_text makes: at most `max` bytes, well-formed UTF-8, no
// control characters (a receiver copies such a line as it is, and escapes any other).
bool log_text_clean(std::string_view text, std::size_t max);

}  // namespace outrun::protocol
