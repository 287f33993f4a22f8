#include "log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>

#include "outrun/spdlog_sink.h"

namespace outrun {

const char* to_string(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warning";
    case LogLevel::error:
      return "error";
  }
  return "?";
}

LogSink stderr_log_sink(LogLevel min) {
  // One logger for every Host of the process, never registered with spdlog (so neither
  // spdlog's default logger nor its registry is touched, and an application's spdlog setup
  // does not change where these lines go).
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto lg = std::make_shared<spdlog::logger>("outrun",
                                               std::make_shared<spdlog::sinks::stderr_sink_mt>());
    lg->set_level(spdlog::level::trace);  // the sink's `min` filters
    lg->flush_on(spdlog::level::trace);
    return lg;
  }();
  return [min, to = spdlog_sink(logger)](LogLevel level, std::string_view line) {
    if (level >= min) to(level, line);
  };
}

}  // namespace outrun
