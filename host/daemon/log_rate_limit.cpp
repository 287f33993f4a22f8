#include "log_rate_limit.h"

#include <algorithm>

namespace outrun::daemon {

LogRateLimit::LogRateLimit(uint32_t per_second, Clock::time_point now)
    : per_second_(std::max<uint32_t>(1, per_second)) {
  MutexLock lock(mu_);
  tokens_ = per_second_;
  refilled_ = now;
  reported_ = now;
}

bool LogRateLimit::admit(Clock::time_point now) {
  MutexLock lock(mu_);
  if (now > refilled_) {
    const double secs = std::chrono::duration<double>(now - refilled_).count();
    tokens_ = std::min<double>(per_second_, tokens_ + secs * per_second_);
    refilled_ = now;
  }
  if (tokens_ >= 1) {
    tokens_ -= 1;
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
