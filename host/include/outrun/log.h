// Where outrun's own log lines go (HostOptions::log). The library never touches spdlog's
// default logger: without a sink it writes to stderr through a logger of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace outrun {

enum class LogLevel : uint8_t { debug, info, warn, error };
const char* to_string(LogLevel level);  // "debug", "info", "warning", "error"

// Receives one line of text (no newline) and its level. Called from the host's loop thread and
// its dispatcher threads, possibly at the same time: it must be thread-safe. Lines are rare
// (a worker's death, its stderr, a callback that threw): never one per evaluation.
using LogSink = std::function<void(LogLevel level, std::string_view line)>;

// The default: stderr, "[time] [outrun] [level] line", lines below `min` dropped.
LogSink stderr_log_sink(LogLevel min = LogLevel::info);

}  // namespace outrun
