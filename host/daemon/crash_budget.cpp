#include "crash_budget.h"

#include <algorithm>

namespace outrun::daemon {

namespace {
int64_t ns_of(CrashBudget::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

bool CrashBudget::charge(uint32_t uid, Clock::time_point now) {
  charged_.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(mu_);
  if (by_uid_.size() > 64) prune(now);  // bounded by the uids that crash within a window
  PerUid& u = by_uid_[uid];
  if (now < u.cool_until) return false;  // refused from here on anyway: nothing to add
  if (u.crashes == 0 || now - u.window_start >= limits_.window) {
    u.window_start = now;
    u.crashes = 0;
  }
  if (++u.crashes < limits_.max_crashes) return false;
  // The cool-down is the penalty; the crashes before it are forgiven (a uid back from one starts
  // with a whole budget, as the host's crash loop does).
  u.crashes = 0;
  u.cool_until = now + limits_.cooldown;
  cooldowns_.fetch_add(1, std::memory_order_relaxed);
  const int64_t until = ns_of(u.cool_until);
  int64_t seen = cool_until_max_ns_.load(std::memory_order_relaxed);
  while (seen < until && !cool_until_max_ns_.compare_exchange_weak(seen, until)) {
  }
  return true;
}

std::string CrashBudget::refusal(uint32_t uid, Clock::time_point now) const {
  if (ns_of(now) >= cool_until_max_ns_.load(std::memory_order_relaxed)) return {};
  std::chrono::milliseconds left{0};
  {
    MutexLock lock(mu_);
    auto it = by_uid_.find(uid);
    if (it == by_uid_.end() || now >= it->second.cool_until) return {};
    left = std::chrono::ceil<std::chrono::milliseconds>(it->second.cool_until - now);
  }
  return "uid " + std::to_string(uid) + " crashed workers " + std::to_string(limits_.max_crashes) +
         " times within " + std::to_string(limits_.window.count()) +
         " ms (daemon.max_crashes_per_uid, crash_window_ms): its evaluations and new scripts are "
         "refused for the cool-down (daemon.crash_cooldown_ms = " +
         std::to_string(limits_.cooldown.count()) + "), " + std::to_string(left.count()) +
         " ms more";
}

CrashBudget::Stats CrashBudget::stats(Clock::time_point now) const {
  Stats s;
  s.charged = charged_.load(std::memory_order_relaxed);
  s.cooldowns = cooldowns_.load(std::memory_order_relaxed);
  s.refusals = refusals_.load(std::memory_order_relaxed);
  MutexLock lock(mu_);
  s.uids_in_cooldown = static_cast<std::size_t>(std::count_if(
      by_uid_.begin(), by_uid_.end(), [&](const auto& u) { return now < u.second.cool_until; }));
  return s;
}

void CrashBudget::prune(Clock::time_point now) {
  std::erase_if(by_uid_, [&](const auto& u) {
    return now >= u.second.cool_until && now - u.second.window_start >= limits_.window;
  });
}

}  // namespace outrun::daemon
