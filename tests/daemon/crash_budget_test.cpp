// outrund's crash budget and log rate limit (host/daemon/crash_budget.h, log_rate_limit.h) with
// an injected clock; the daemon's use of them is tested in crash_daemon_test.cpp.
#include "crash_budget.h"

#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "log_rate_limit.h"

using namespace std::chrono_literals;
using outrun::daemon::CrashBudget;
using outrun::daemon::LogRateLimit;

TEST_CASE("CrashBudget: the max_crashes-th crash within the window starts the cool-down") {
  CrashBudget b(CrashBudget::Limits{3, 10'000ms, 60'000ms});
  const auto t0 = CrashBudget::Clock::time_point(1000s);
  CHECK(!b.charge(7, t0));
  CHECK(!b.charge(7, t0 + 1s));
  CHECK(b.refusal(7, t0 + 1s).empty());
  CHECK(b.charge(7, t0 + 2s));  // the third within 10 s
  const std::string why = b.refusal(7, t0 + 2s);
  CHECK(why.find("uid 7 crashed workers 3 times within 10000 ms") != std::string::npos);
  CHECK(why.find("daemon.crash_cooldown_ms = 60000") != std::string::npos);
  CHECK(why.find("60000 ms more") != std::string::npos);
  CHECK(b.refusal(7, t0 + 32s).find("30000 ms more") != std::string::npos);
  CHECK(b.refusal(8, t0 + 2s).empty());  // another uid is not touched
  // Charged while cooling down: counted, the cool-down is not extended.
  CHECK(!b.charge(7, t0 + 3s));
  b.count_refusals(5);
  CrashBudget::Stats s = b.stats(t0 + 3s);
  CHECK(s.charged == 4);
  CHECK(s.cooldowns == 1);
  CHECK(s.refusals == 5);
  CHECK(s.uids_in_cooldown == 1);
  // The cool-down ends; the uid starts with a whole budget.
  CHECK(b.refusal(7, t0 + 62s).empty());
  CHECK(b.stats(t0 + 62s).uids_in_cooldown == 0);
  CHECK(!b.charge(7, t0 + 63s));
  CHECK(!b.charge(7, t0 + 64s));
  CHECK(b.charge(7, t0 + 65s));
}

TEST_CASE("CrashBudget: crashes spread over more than the window never start a cool-down") {
  CrashBudget b(CrashBudget::Limits{2, 1000ms, 5000ms});
  auto t = CrashBudget::Clock::time_point(50s);
  for (int i = 0; i < 20; ++i, t += 1001ms) {
    CAPTURE(i);
    CHECK(!b.charge(1, t));
    CHECK(b.refusal(1, t).empty());
  }
  // Two within the window do.
  CHECK(!b.charge(2, t));
  CHECK(b.charge(2, t + 999ms));
  CHECK(!b.refusal(2, t + 999ms).empty());
  CHECK(b.refusal(2, t + 999ms + 5000ms).empty());
}

TEST_CASE("CrashBudget: many uids are forgotten once their window and cool-down are over") {
  CrashBudget b(CrashBudget::Limits{1, 100ms, 100ms});
  auto t = CrashBudget::Clock::time_point(10s);
  for (uint32_t uid = 0; uid < 1000; ++uid) b.charge(uid, t);
  CHECK(b.stats(t).uids_in_cooldown == 1000);
  CHECK(b.stats(t + 100ms).uids_in_cooldown == 0);
  CHECK(b.charge(5000, t + 1s));  // prunes the others; still counts its own
  CHECK(b.stats(t + 1s).uids_in_cooldown == 1);
}

TEST_CASE("LogRateLimit: a burst of per_second lines, then per_second a second, the rest counted") {
  const auto t0 = LogRateLimit::Clock::time_point(100s);
  LogRateLimit l(10, t0);
  int passed = 0;
  for (int i = 0; i < 100; ++i) passed += l.admit(t0) ? 1 : 0;
  CHECK(passed == 10);  // the full bucket
  CHECK(l.suppressed_total() == 90);
  CHECK(l.take_report(t0 + 500ms, 1000ms) == 0);  // not yet a second since the last report
  // A line every 10 ms for 2 s: 10 a second pass (the bucket refills at that rate).
  passed = 0;
  for (int i = 1; i <= 200; ++i) passed += l.admit(t0 + i * 10ms) ? 1 : 0;
  CHECK(passed == 20);
  CHECK(l.take_report(t0 + 2s, 1000ms) == 90 + 180);
  CHECK(l.take_report(t0 + 2s, 1000ms) == 0);   // reported once
  CHECK(l.take_report(t0 + 10s, 1000ms) == 0);  // nothing dropped since
  CHECK(l.report_line(270).find("270 log lines of the host suppressed "
                                "(host.crash_log_per_second = 10)") != std::string::npos);
  // Idle for long: the bucket holds per_second again, not more.
  passed = 0;
  for (int i = 0; i < 50; ++i) passed += l.admit(t0 + 60s) ? 1 : 0;
  CHECK(passed == 10);
  CHECK(l.suppressed_total() == 90 + 180 + 40);
}
