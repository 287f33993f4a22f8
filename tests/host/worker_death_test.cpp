// The pure pieces of a worker's death (no process): the Death record a process's end makes
// (make_death, behind WorkerProcess::death), the cause an exit status names, and how a restart
// decision is applied (detail::apply_restart: the crash loop first, the timer armed once).
#include <doctest/doctest.h>
#include <uv.h>

#include <string>
#include <vector>

#include "restart_policy.h"
#include "worker_process.h"

using namespace outrun;
using namespace outrun::detail;
using namespace std::chrono_literals;

TEST_CASE("worker death: an exit status names the cause of a death the host did not decide") {
  CHECK(ExitStatus{0, 11}.cause() == DeathCause::kCrash);
  CHECK(ExitStatus{0, 9}.cause() == DeathCause::kCrash);
  CHECK(ExitStatus{3, 0}.cause() == DeathCause::kExit);
  CHECK(ExitStatus{0, 0}.cause() == DeathCause::kExit);
  CHECK(ExitStatus{0, 0}.clean());
  CHECK_FALSE(ExitStatus{3, 0}.clean());
}

TEST_CASE("worker death: the Death record - the host's decision names the cause") {
  SUBCASE("noticed by its exit status") {
    const Death d = make_death(DeathCause::kCrash, std::nullopt, ExitStatus{0, 11}, 250ms, false,
                               "was killed by signal 11 (Segmentation fault)");
    CHECK(d.cause == DeathCause::kCrash);
    CHECK(d.signal == 11);
    CHECK(d.exit_code == 0);
    CHECK(d.uptime == 250ms);
    CHECK_FALSE(d.restart_requested);
    CHECK_FALSE(d.charged);
    CHECK(d.how == "was killed by signal 11 (Segmentation fault)");
  }
  SUBCASE("a kill the host decided: its cause wins over what noticed the death") {
    const Death d = make_death(DeathCause::kCrash, DeathCause::kOverrun, ExitStatus{0, 9}, 1s,
                               false, "was killed: an evaluation ran past T+G");
    CHECK(d.cause == DeathCause::kOverrun);
    CHECK(d.signal == 9);
  }
  SUBCASE("not reaped yet: no exit code, no signal; a restart was requested") {
    const Death d = make_death(DeathCause::kProtocol, std::nullopt, std::nullopt, 2s, true,
                               "violated the protocol");
    CHECK(d.cause == DeathCause::kProtocol);
    CHECK(d.exit_code == 0);
    CHECK(d.signal == 0);
    CHECK(d.restart_requested);
  }
}

namespace {

struct Loop {
  uv_loop_t loop{};
  uv_timer_t timer{};
  int fired = 0;
  Loop() {
    REQUIRE(uv_loop_init(&loop) == 0);
    uv_timer_init(&loop, &timer);
    timer.data = this;
  }
  ~Loop() {
    uv_close(reinterpret_cast<uv_handle_t*>(&timer), nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
  static void on_restart(uv_timer_t* t) { ++static_cast<Loop*>(t->data)->fired; }
};

}  // namespace

TEST_CASE("worker death: a restart decision is applied once - crash loop first, one timer") {
  Loop l;
  std::vector<std::string> crash_loops;
  const auto enter = [&](const std::string& why) {
    // Entered before the timer is armed for the cool-down.
    CHECK_FALSE(uv_is_active(reinterpret_cast<uv_handle_t*>(&l.timer)));
    crash_loops.push_back(why);
  };
  SUBCASE("a restart: the timer only") {
    apply_restart(&l.timer, &Loop::on_restart, {RestartDecision::Kind::kRestart, 5ms, {}}, enter);
    CHECK(crash_loops.empty());
    CHECK(uv_is_active(reinterpret_cast<uv_handle_t*>(&l.timer)));
    CHECK(uv_timer_get_repeat(&l.timer) == 0);
  }
  SUBCASE("a crash loop: entered with its reason, then the timer for the cool-down") {
    apply_restart(&l.timer, &Loop::on_restart,
                  {RestartDecision::Kind::kCrashLoop, 5ms, "shard 0 is in a crash loop"}, enter);
    CHECK(crash_loops == std::vector<std::string>{"shard 0 is in a crash loop"});
    CHECK(uv_is_active(reinterpret_cast<uv_handle_t*>(&l.timer)));
  }
  uv_run(&l.loop, UV_RUN_DEFAULT);  // returns once the timer fired: nothing else is active
  CHECK(l.fired == 1);
  CHECK(crash_loops.size() <= 1);
}
