#include "log_rate_limit.h"

#include <algorithm>

namespace outrun::daemon {

namespace {
constexpr uint64_t kLine = 1'000'000'000;  // what one line costs, in nanosecond-lines
}  // namespace

LogRateLimit::LogRateLimit(uint32_t per_second, Clock::time_point now)
    : per_second_(std::max<uint32_t>(1, per_second)) {
  MutexLock lock(mu_);
  credit_ = uint64_t{per_second_} * kLine;
  refilled_ = now;
  reported_ = now;
}

bool LogRateLimit::admit(Clock::time_point now) {
  MutexLock lock(mu_);
  const uint64_t full = uint64_t{per_second_} * kLine;
  if (now > refilled_) {
    // Capped before multiplying: a day of nanoseconds times 10^6 lines/s would overflow.
    const auto ns = static_cast<uint64_t>(std::min<int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - refilled_).count(), kLine));
    credit_ = std::min(full, credit_ + ns * per_second_);
    refilled_ = now;
  }
  if (credit_ >= kLine) {
    credit_ -= kLine;
    return true;
  }
  ++unreported_;
  ++total_;
  return false;
}

uint64_t LogRateLimit::take_report(Clock::time_point now, std::chrono::milliseconds every) {
  MutexLock lock(mu_);
  if (unreported_ == 0 || now - reported_ < every) return 0;
  const uint64_t n = unreported_;
  unreported_ = 0;
  reported_ = now;
  return n;
}

uint64_t LogRateLimit::suppressed_total() const {
  MutexLock lock(mu_);
  return total_;
}

std::string LogRateLimit::report_line(uint64_t n) const {
  return "outrund: " + std::to_string(n) +
         " log lines of the host suppressed (host.crash_log_per_second = " +
         std::to_string(per_second_) + ")";
}

}  // namespace outrun::daemon
