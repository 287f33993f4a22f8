#pragma once

#include <time.h>

#include <cstdint>

namespace outrun::detail {

// CLOCK_MONOTONIC in nanoseconds: the clock of the status page (the worker's heartbeats and
// running-since stamps) and of quarantines.
inline int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace outrun::detail
