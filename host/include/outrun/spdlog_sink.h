// Sends outrun's log lines to an application's own spdlog logger:
//   options.log = outrun::spdlog_sink(my_logger);
// Header-only, so the library's interface needs no spdlog; include it only where spdlog is used.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <utility>

#include "outrun/log.h"

namespace outrun {

inline LogSink spdlog_sink(std::shared_ptr<spdlog::logger> logger) {
  return [logger = std::move(logger)](LogLevel level, std::string_view line) {
    static constexpr spdlog::level::level_enum kLevels[] = {
        spdlog::level::debug, spdlog::level::info, spdlog::level::warn, spdlog::level::err};
    logger->log(kLevels[static_cast<int>(level)], "{}", line);
  };
}

}  // namespace outrun
