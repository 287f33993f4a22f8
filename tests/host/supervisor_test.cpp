// The supervisor alone (no worker process): what a death settles -- the crash charged to the
// script the worker was running, the others retried, a quarantined script's evaluations ended --
// and what follows a death on a real uv loop: the restart timer armed once, or the crash loop
// entered first (what waits ends `unavailable`), and no restart once the host stops.
#include "supervisor.h"

#include <doctest/doctest.h>
#include <uv.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host_impl.h"
#include "script_registry.h"

using namespace outrun;
using namespace outrun::detail;
using namespace std::chrono_literals;

namespace {

// A host that never starts (no worker), its reader, quarantine and slow lane, one shard of its
// own and a supervisor of that shard on a loop of its own, run by this thread (the loop's role).
struct Bench {
  explicit Bench(int crash_loop_limit = 5, int quarantine_after = 2) {
    HostOptions o;
    o.shards = 1;
    o.slow_lane = true;
    o.quarantine_after = quarantine_after;
    impl = std::make_unique<Host::Impl>(o);
    impl->loop_role.bind_to_current_thread();
    shards.push_back(std::make_unique<Shard>(0, impl->loop_role));
    REQUIRE(uv_loop_init(&loop) == 0);
    Supervisor::Config c;
    c.timeout = o.timeout;
    c.grace = o.grace;
    c.silence_limit = o.silence_limit;
    c.restart.crash_loop_limit = crash_loop_limit;
    c.restart.restart_delay = 1ms;
    c.restart.crash_loop_cooldown = 1ms;
    sup = std::make_unique<Supervisor>(&loop, impl->loop_role, impl->log, c, shards, stopping,
                                       impl->reader, impl->quarantine, impl->slow, impl->started,
                                       *impl);
  }
  ~Bench() {
    sup->close();
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  }
  Shard& sh() { return *shards[0]; }
  Script script(const char* key) {
    Script s;
    REQUIRE_FALSE(scripts.add(key, "return 1", &s));
    return s;
  }
  // Admitted at `place` (kSending: written to the worker at once, as submit() does).
  uint64_t admit(const Script& s, SyncWaiter& w, SlotPlace place = SlotPlace::kSending) {
    MutexLock lock(sh().mu);
    const uint32_t idx = sh().table.admit(s, {}, Completion(&w), place, false);
    if (place == SlotPlace::kSending) sh().table.mark_sent(idx, SentWith::kId);
    return sh().table.id(idx);
  }
  std::size_t waiting() {
    MutexLock lock(sh().mu);
    return sh().table.waiting_count();
  }
  ShardState state() {
    MutexLock lock(sh().mu);
    return sh().state;
  }

  ScriptRegistry scripts{nullptr, 1, 1u << 20, /*deferred_ids=*/false};
  std::unique_ptr<Host::Impl> impl;
  std::vector<std::unique_ptr<Shard>> shards;
  std::atomic<bool> stopping{false};
  uv_loop_t loop{};
  std::unique_ptr<Supervisor> sup;
};

Death crash(uint64_t running) {
  Death d = make_death(DeathCause::kCrash, std::nullopt, ExitStatus{0, 11}, 5s, false,
                       "was killed by signal 11 (Segmentation fault)");
  d.running = running;
  return d;
}

}  // namespace

TEST_CASE("supervisor: a crash is charged to the script its worker ran - the others retried") {
  Bench b;
  b.sh().loop_role.assert_here();
  const Script a = b.script("a"), other = b.script("b");
  SyncWaiter wa(b.sh().reading), wb(b.sh().reading);
  const uint64_t ida = b.admit(a, wa);
  b.admit(other, wb);
  Death d = crash(ida);
  Ended ended;
  {
    MutexLock lock(b.sh().mu);
    b.sup->settle_death(b.sh(), ExitStatus{0, 11}, &d, /*stop=*/false, &ended);
  }
  CHECK(d.charged);
  REQUIRE(ended.size() == 1);
  CHECK(ended[0].second.status == Status::worker_lost);
  CHECK(ended[0].second.killed_worker);
  CHECK(record_of(a)->crashes.load() == 1);
  CHECK(record_of(other)->crashes.load() == 0);
  CHECK(b.sh().crashes_charged.load() == 1);
  CHECK(record_of(a)->slow.load());  // charged: into the slow lane
  CHECK(b.impl->slow.moves_in() == 1);
  CHECK(b.waiting() == 1);  // the other one, retried (for the next worker)
  CHECK(b.sh().retried.load() == 1);
  for (auto& [c, r] : ended) c.deliver(std::move(r), b.impl->log);
  CHECK(wa.ready());
  CHECK_FALSE(wb.ready());
}

TEST_CASE("supervisor: a death nothing explains is charged to nobody") {
  Bench b;
  b.sh().loop_role.assert_here();
  const Script a = b.script("a");
  SyncWaiter wa(b.sh().reading);
  const uint64_t ida = b.admit(a, wa);
  // Killed from outside (SIGKILL): says nothing about the script that happened to run.
  Death d = make_death(DeathCause::kCrash, std::nullopt, ExitStatus{0, 9}, 5s, false, "killed");
  d.running = ida;
  Ended ended;
  {
    MutexLock lock(b.sh().mu);
    b.sup->settle_death(b.sh(), ExitStatus{0, 9}, &d, false, &ended);
  }
  CHECK_FALSE(d.charged);
  CHECK(record_of(a)->crashes.load() == 0);
  REQUIRE(ended.size() == 1);  // it ran when its worker crashed: not retried, nobody's fault
  CHECK_FALSE(ended[0].second.killed_worker);
}

TEST_CASE("supervisor: a script quarantined by the crash has its waiting evaluations ended") {
  Bench b(/*crash_loop_limit=*/5, /*quarantine_after=*/1);
  b.sh().loop_role.assert_here();
  const Script a = b.script("a");
  SyncWaiter running(b.sh().reading), queued(b.sh().reading);
  const uint64_t id = b.admit(a, running);
  b.admit(a, queued, SlotPlace::kQueued);
  Death d = crash(id);
  Ended ended;
  {
    MutexLock lock(b.sh().mu);
    b.sup->settle_death(b.sh(), ExitStatus{0, 11}, &d, false, &ended);
  }
  REQUIRE(ended.size() == 2);
  CHECK(ended[1].second.status == Status::runtime_error);
  CHECK(ended[1].second.error.find("is quarantined") != std::string::npos);
  CHECK(b.waiting() == 0);
  CHECK(b.sh().quarantine_refusals.load() == 1);
}

TEST_CASE("supervisor: after a death - the restart timer once, or the crash loop first") {
  SUBCASE("below the crash-loop limit: the restart timer, nothing ends") {
    Bench b(/*crash_loop_limit=*/5);
    b.sh().loop_role.assert_here();
    SyncWaiter w(b.sh().reading);
    b.admit(b.script("a"), w, SlotPlace::kQueued);
    b.sup->after_death(b.sh(), crash(0));
    CHECK(b.sup->restart_armed(b.sh()));
    CHECK(b.state() == ShardState::kDown);
    CHECK_FALSE(w.ready());
    // The host stops before the timer fires: it starts nothing.
    b.stopping = true;
    uv_run(&b.loop, UV_RUN_DEFAULT);  // returns once the timer fired
    CHECK_FALSE(b.sup->restart_armed(b.sh()));
    CHECK(b.sh().worker == nullptr);
  }
  SUBCASE("at the limit: the crash loop - what waits ends unavailable, then the cool-down") {
    Bench b(/*crash_loop_limit=*/1);
    b.sh().loop_role.assert_here();
    SyncWaiter w(b.sh().reading);
    b.admit(b.script("a"), w, SlotPlace::kQueued);
    b.sup->after_death(b.sh(), crash(0));
    CHECK(b.state() == ShardState::kCrashLoop);
    REQUIRE(w.ready());
    CHECK(w.take_ready().status == Status::unavailable);
    CHECK(b.sup->restart_armed(b.sh()));  // the cool-down
    b.sup->stop_restarts(b.sh());
    CHECK_FALSE(b.sup->restart_armed(b.sh()));
  }
}
