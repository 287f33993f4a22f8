// The restart policy as a value, with a fake clock and no processes: backoff, the crash-loop
// window and cool-down, fatal exit codes, and which evaluations of a dead worker are retried.
#include "restart_policy.h"

#include <doctest/doctest.h>

#include <vector>

using namespace outrun;
using namespace outrun::detail;
using namespace std::chrono_literals;

namespace {

RestartConfig config() {
  RestartConfig c;
  c.restart_delay = 10ms;
  c.max_restart_delay = 200ms;
  c.healthy_uptime = 1000ms;
  c.crash_loop_limit = 3;
  c.crash_loop_window = 1000ms;
  c.crash_loop_cooldown = 30000ms;
  c.retries = 1;
  c.timeout = 100ms;
  c.grace = 50ms;
  return c;
}

Death crash(Clock::duration uptime = 10ms) {
  Death d;
  d.cause = DeathCause::kCrash;
  d.signal = 11;
  d.uptime = uptime;
  d.how = "was killed by signal 11 (Segmentation fault)";
  return d;
}

Death exit_code(int64_t code) {
  Death d;
  d.cause = DeathCause::kExit;
  d.exit_code = code;
  d.uptime = 5ms;
  d.how = "exited with code " + std::to_string(code);
  return d;
}

Death kill(DeathCause cause) {
  Death d;
  d.cause = cause;
  d.uptime = 5000ms;
  d.how = "was killed";
  return d;
}

}  // namespace

TEST_CASE("restart policy: quick crashes back off doubling up to the cap, a healthy one resets") {
  RestartConfig c = config();
  c.crash_loop_limit = 1000;
  RestartPolicy p(0, c);
  Clock::time_point t{};
  std::vector<int64_t> delays;
  for (int i = 0; i < 7; ++i) {
    t += 2000ms;  // outside the window: no crash loop, only the backoff
    const RestartDecision d = p.on_death(crash(10ms), t);
    REQUIRE(d.kind == RestartDecision::Kind::kRestart);
    delays.push_back(d.delay.count());
  }
  CHECK(delays == std::vector<int64_t>{20, 40, 80, 160, 200, 200, 200});
  // A worker that lived past healthy_uptime restarts after restart_delay again.
  CHECK(p.on_death(crash(1500ms), t + 2000ms).delay == 10ms);
  CHECK(p.on_death(crash(10ms), t + 4000ms).delay == 20ms);
}

TEST_CASE(
    "restart policy: crash_loop_limit crashes within the window is a crash loop, older ones "
    "slide out") {
  RestartPolicy p(3, config());
  const Clock::time_point t0{};
  CHECK(p.on_death(crash(), t0).kind == RestartDecision::Kind::kRestart);
  CHECK(p.on_death(crash(), t0 + 600ms).kind == RestartDecision::Kind::kRestart);
  // The first has slid out of the 1000 ms window: two within it.
  CHECK(p.on_death(crash(), t0 + 1200ms).kind == RestartDecision::Kind::kRestart);
  CHECK(p.recent_crashes() == 2);
  const RestartDecision loop = p.on_death(crash(), t0 + 1300ms);
  REQUIRE(loop.kind == RestartDecision::Kind::kCrashLoop);
  CHECK(loop.delay == 30000ms);  // the cool-down
  CHECK(loop.reason ==
        "shard 3 is in a crash loop: its worker crashed 3 times in 1000 ms (last: was killed by "
        "signal 11 (Segmentation fault)); next start in 30000 ms");
  // The cool-down forgives the crashes before it: the next worker starts a fresh count.
  CHECK(p.recent_crashes() == 0);
  const RestartDecision after = p.on_death(crash(), t0 + 31400ms);
  CHECK(after.kind == RestartDecision::Kind::kRestart);
  CHECK(after.delay == 20ms);
  p.reset();
  CHECK(p.recent_crashes() == 0);
}

TEST_CASE("restart policy: exit codes that will fail again go to the crash loop at once") {
  RestartPolicy p(1, config());
  const Clock::time_point t{};
  for (int64_t code : {64, 79}) {
    const RestartDecision d = p.on_death(exit_code(code), t);
    REQUIRE(d.kind == RestartDecision::Kind::kCrashLoop);
    CHECK(d.reason.find("shard 1 is in a crash loop: its worker exited with code " +
                        std::to_string(code) + ", which starting it again will not change") == 0);
    CHECK(d.delay == 30000ms);
  }
  // Other error exits are crashes like any other: restart with backoff.
  for (int64_t code : {1, 70, 74, 78}) {
    RestartPolicy q(1, config());
    const RestartDecision d = q.on_death(exit_code(code), t);
    CHECK(d.kind == RestartDecision::Kind::kRestart);
    CHECK(d.delay == 20ms);
    CHECK(q.recent_crashes() == 1);
  }
  CHECK(RestartPolicy::fatal_exit(79));
  CHECK_FALSE(RestartPolicy::fatal_exit(0));
}

TEST_CASE(
    "restart policy: kills the host decided, requests and charged crashes are not the "
    "shard's crashes") {
  RestartPolicy p(0, config());
  Clock::time_point t{};
  for (int i = 0; i < 10; ++i) {
    t += 1ms;
    CHECK(p.on_death(kill(DeathCause::kOverrun), t).delay == 10ms);
    CHECK(p.on_death(kill(DeathCause::kSilence), t).delay == 10ms);
    CHECK(p.on_death(kill(DeathCause::kRequested), t).delay == 0ms);
    Death charged = crash();
    charged.charged = true;
    CHECK(p.on_death(charged, t).delay == 10ms);
    Death requested = crash();
    requested.restart_requested = true;
    CHECK(p.on_death(requested, t).delay == 0ms);
  }
  CHECK(p.recent_crashes() == 0);
  CHECK(RestartPolicy::is_crash(DeathCause::kProtocol));
  CHECK_FALSE(RestartPolicy::is_crash(DeathCause::kSilence));
}

TEST_CASE("restart policy: a worker that cannot be started counts as a crash") {
  RestartPolicy p(2, config());
  const Clock::time_point t{};
  CHECK(p.on_start_failure("no such file", t).delay == 20ms);
  CHECK(p.on_start_failure("no such file", t + 1ms).delay == 40ms);
  const RestartDecision d = p.on_start_failure("no such file", t + 2ms);
  REQUIRE(d.kind == RestartDecision::Kind::kCrashLoop);
  CHECK(d.reason.find("(last: could not be started: no such file)") != std::string::npos);
}

TEST_CASE("restart policy: which evaluations of a dead worker are retried") {
  const RestartPolicy p(0, config());
  const uint64_t running = 7, other = 9;
  SUBCASE("a crash ends the running one worker_lost and retries the others once") {
    const EvaluationFate suspect = p.fate(crash(), false, running, running, 0, 0);
    CHECK_FALSE(suspect.retry);
    CHECK(suspect.status == Status::worker_lost);
    CHECK(suspect.error == "its worker was killed by signal 11 (Segmentation fault)");
    CHECK(p.fate(crash(), false, other, running, 0, 0).retry);
    const EvaluationFate twice = p.fate(crash(), false, other, running, 0, 1);
    CHECK_FALSE(twice.retry);
    CHECK(twice.status == Status::worker_lost);
  }
  SUBCASE("an overrun ends the one past T+G killed and retries the others") {
    const Death d = kill(DeathCause::kOverrun);
    const EvaluationFate killed = p.fate(d, false, running, running, running, 0);
    CHECK(killed.status == Status::killed);
    CHECK(killed.error ==
          "script ran past its timeout of 100 ms and grace of 50 ms; its worker was killed");
    CHECK(p.fate(d, false, other, running, running, 0).retry);
  }
  SUBCASE("silence and requested kills have no suspect: even the running one is retried") {
    CHECK(p.fate(kill(DeathCause::kSilence), false, running, running, 0, 0).retry);
    CHECK(p.fate(kill(DeathCause::kRequested), false, running, running, 0, 0).retry);
  }
  SUBCASE("a host that stops cancels everything") {
    const EvaluationFate f = p.fate(crash(), true, running, running, 0, 0);
    CHECK_FALSE(f.retry);
    CHECK(f.status == Status::cancelled);
  }
}
