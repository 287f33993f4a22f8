// outrund's crash budget per uid (design/daemon.md "Crash budget", decision D-crash-budget): the
// worker deaths each peer uid's evaluations caused (Result::killed_worker), at most
// max_crashes_per_uid within crash_window; the crash that reaches it puts the uid in a cool-down
// of crash_cooldown, during which its new registrations and its evaluations are refused. The
// host's quarantine charges the script; this charges who sent it, so that new bytes under a key
// (a new record, a fresh quarantine count) do not buy new crashes. Any thread (one mutex); the
// clock is the caller's, so tests drive it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "outrun/thread_annotations.h"

namespace outrun::daemon {

class CrashBudget {
 public:
  using Clock = std::chrono::steady_clock;
  struct Limits {
    uint32_t max_crashes = 10;                 // per uid within `window`: the last one starts
    std::chrono::milliseconds window{10'000};  // the window starts at a uid's first crash
    std::chrono::milliseconds cooldown{60'000};
  };
  struct Stats {
    uint64_t charged = 0;    // crashes charged, all uids
    uint64_t cooldowns = 0;  // cool-downs started
    uint64_t refusals = 0;   // evaluations and registrations refused
    std::size_t uids_in_cooldown = 0;
  };

  explicit CrashBudget(Limits limits) : limits_(limits) {}

  // One worker death charged to `uid`. True when it starts the uid's cool-down (its crashes
  // within the window reached max_crashes); a uid already cooling down is charged, not extended.
  bool charge(uint32_t uid, Clock::time_point now) EXCLUDES(mu_);
  // Empty when `uid` may go on; else why it is refused, naming the cool-down and what is left.
  // Lock-free while no uid is cooling down (the evaluation path asks once per frame).
  std::string refusal(uint32_t uid, Clock::time_point now) const EXCLUDES(mu_);
  // `n` requests refused with refusal()'s answer (stats).
  void count_refusals(uint64_t n) { refusals_.fetch_add(n, std::memory_order_relaxed); }
  Stats stats(Clock::time_point now) const EXCLUDES(mu_);
  const Limits& limits() const { return limits_; }

 private:
  struct PerUid {
    Clock::time_point window_start{};
    uint32_t crashes = 0;  // within the window that started at window_start
    Clock::time_point cool_until{};
  };
  // Forgets uids whose window and cool-down are both over.
  void prune(Clock::time_point now) REQUIRES(mu_);

  const Limits limits_;
  mutable Mutex mu_;  // guards by_uid_
  std::unordered_map<uint32_t, PerUid> by_uid_ GUARDED_BY(mu_);
  // The latest cool_until of any uid, as steady-clock nanoseconds: refusal()'s fast path.
  std::atomic<int64_t> cool_until_max_ns_{0};
  std::atomic<uint64_t> charged_{0}, cooldowns_{0}, refusals_{0};
};

}  // namespace outrun::daemon
