// A token bucket for log lines (design/daemon.md "Crash budget"): outrund passes the Host's log
// lines -- a worker's death, its stderr, a quarantine -- through one, host.crash_log_per_second
// lines a second with a burst of as many, so that a client crashing workers in a loop cannot
// fill the log (issue 29: 216 lines/s). What it drops is counted and reported in one line at
// most once per report interval. Any thread (one mutex); the clock is the caller's.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "outrun/thread_annotations.h"

namespace outrun::daemon {

class LogRateLimit {
 public:
  using Clock = std::chrono::steady_clock;

  // `per_second` >= 1: the refill rate and the bucket's size (a full bucket at the start).
  LogRateLimit(uint32_t per_second, Clock::time_point now);

  // True: write the line (a token taken). False: drop it (counted).
  bool admit(Clock::time_point now) EXCLUDES(mu_);
  // The lines dropped since the last report, when there are some and `every` has passed since
  // that report (0 otherwise); they are then reported.
  uint64_t take_report(Clock::time_point now, std::chrono::milliseconds every) EXCLUDES(mu_);
  uint64_t suppressed_total() const EXCLUDES(mu_);
  uint32_t per_second() const { return per_second_; }
  // The report line for `n` dropped lines.
  std::string report_line(uint64_t n) const;

 private:
  const uint32_t per_second_;
  mutable Mutex mu_;  // guards the bucket and the counts
  // In nanosecond-lines: a line costs 10^9, a nanosecond adds per_second_ (integers: a line
  // every 1/per_second s always passes, no rounding drift).
  uint64_t credit_ GUARDED_BY(mu_);
  Clock::time_point refilled_ GUARDED_BY(mu_);
  Clock::time_point reported_ GUARDED_BY(mu_);
  uint64_t unreported_ GUARDED_BY(mu_) = 0;
  uint64_t total_ GUARDED_BY(mu_) = 0;
};

}  // namespace outrun::daemon
