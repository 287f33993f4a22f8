// The library's logger: formats a line and hands it to HostOptions::log (or the stderr default).
#pragma once

#include <spdlog/fmt/fmt.h>

#include <string>
#include <utility>

#include "outrun/log.h"

namespace outrun::detail {

class Log {
 public:
  explicit Log(LogSink sink) : sink_(sink ? std::move(sink) : stderr_log_sink()) {}

  // A sink that throws loses its line; it never takes the loop or a dispatcher down with it.
  template <class... A>
  void operator()(LogLevel level, fmt::format_string<A...> f, A&&... args) const {
    try {
      const std::string line = fmt::format(f, std::forward<A>(args)...);
      sink_(level, line);
    } catch (...) {
    }
  }

 private:
  LogSink sink_;
};

}  // namespace outrun::detail
