// Crash attribution and quarantine through the public API, with real workers: a script that
// crashes its worker is charged with it and quarantined; its shard and the shard's other scripts
// go on serving (design/supervision.md "Crash attribution").
#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <functional>
#include <thread>

#include "host/host_support.h"
#include "outrun/host.h"

using namespace outrun;
using namespace std::chrono_literals;
using test::Collector;
using test::eventually;
using test::FaultEnv;
using test::reg;

namespace {

// Every worker of a host started under this fault raises SIGSEGV when it is sent a source that
// contains the marker.
constexpr const char* kFault = "crash-on-source=CRASH-ME";
// The marker is a string constant: it is in the bytecode a restarted worker gets too.
constexpr const char* kCrashing = "return 'CRASH-ME'";

HostOptions options() {
  HostOptions o;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = 1;
  o.restart_delay = 5ms;
  o.crash_loop_limit = 3;  // fewer than the crashes below, were they the shard's
  o.crash_loop_window = 10s;
  // The crashes and their quarantine on one shard; the slow lane, where a charged crash moves a
  // script to (D-slow-lane), has tests of its own.
  o.slow_lane = false;
  // These tests are about crashes, not kills: no T+G kill on a loaded machine or under TSan.
  o.timeout = 2000ms;
  o.grace = 5000ms;
  return o;
}

Result get(Future f) {
  REQUIRE(f.wait_for(30s) == std::future_status::ready);
  return f.get();
}

bool is_quarantine(const Result& r) {
  return r.status == Status::runtime_error &&
         r.error.find("script 'bad' is quarantined: it crashed its worker") != std::string::npos;
}

// Evaluates `bad` until its second crash quarantines it (both end worker_lost).
void crash_twice(Host& host, const Script& bad) {
  for (int i = 0; i < 2; ++i) {
    const Result r = get(host.evaluate(bad, {}));
    REQUIRE_MESSAGE(r.status == Status::worker_lost, r.error);
  }
}

}  // namespace

TEST_CASE("Quarantine: a script that crashes its worker is quarantined, not its shard") {
  FaultEnv fault(kFault);
  auto host = test::start_host(test::with_test_faults(options()));
  Script bad = reg(*host, "bad", kCrashing);
  Script good = reg(*host, "good", "return inputs.x + 1");
  for (int i = 0; i < 10; ++i) {
    CAPTURE(i);
    auto g = host->evaluate(good, {{"x", i}});
    const Result b = get(host->evaluate(bad, {}));
    if (i < 2) {
      // The crash's suspect: it is not retried.
      CHECK_MESSAGE(b.status == Status::worker_lost, b.error);
      CHECK(b.error.find("signal") != std::string::npos);
      CHECK(b.killed_worker);  // the evaluation the crash is charged to (outrund's crash budget)
    } else {
      CHECK(!b.killed_worker);
      CHECK_MESSAGE(is_quarantine(b), b.error);
      CHECK(b.error.find("it crashed its worker 2 times (last: ") != std::string::npos);
      CHECK(b.error.find("register new source under its key, or wait") != std::string::npos);
    }
    const Result gr = get(std::move(g));
    CHECK_MESSAGE(gr.status == Status::ok, gr.error);
    CHECK(!gr.killed_worker);
    CHECK(gr.value == Value(i + 1));
    CHECK(host->shard_stats(0).state != "crash_loop");
  }
  // The quarantined evaluations never reached a worker: two deaths, both charged to `bad`.
  const ShardStats st = host->shard_stats(0);
  CHECK(st.deaths == 2);
  CHECK(st.crashes_charged == 2);
  CHECK(st.quarantine_refusals == 8);
  CHECK(st.starts == 3);
  CHECK(st.state == "running");
  const ScriptCrashStats sc = host->script_crashes(bad);
  CHECK(sc.crashes == 2);
  CHECK(sc.quarantined);
  CHECK(sc.quarantine_left_ms > 0);
  CHECK(host->script_crashes(good).crashes == 0);
  CHECK(!host->script_crashes(good).quarantined);
  // Batches are refused the same way, one result per request.
  Collector col(2);
  std::vector<Request> batch;
  batch.push_back({bad, {}});
  batch.push_back({good, {{"x", 41}}});
  host->evaluate_batch(std::move(batch), [&](std::size_t i, Result r) { col.record(i, r); });
  REQUIRE(col.wait_all(30s));
  CHECK_MESSAGE(is_quarantine(col.results[0]), col.results[0].error);
  CHECK(col.results[1].value == Value(42));
  CHECK(host->shard_stats(0).deaths == 2);
}

TEST_CASE("Quarantine: registering new source under the key ends it at once") {
  FaultEnv fault(kFault);
  auto o = test::with_test_faults(options());
  o.quarantine_cooldown = 600s;
  auto host = test::start_host(o);
  Script bad = reg(*host, "bad", kCrashing);
  crash_twice(*host, bad);
  CHECK(is_quarantine(get(host->evaluate(bad, {}))));
  // The same source again is the same record: still quarantined.
  Script same = reg(*host, "bad", kCrashing);
  CHECK(is_quarantine(get(host->evaluate(same, {}))));
  // New source is a new record with a clean history; the old handle keeps its own.
  Script fixed = reg(*host, "bad", "return 2");
  const Result r = get(host->evaluate(fixed, {}));
  CHECK_MESSAGE(r.status == Status::ok, r.error);
  CHECK(r.value == Value(2));
  CHECK(host->script_crashes(fixed).crashes == 0);
  CHECK(is_quarantine(get(host->evaluate(bad, {}))));
}

TEST_CASE("Quarantine: it ends after quarantine_cooldown, a crash soon after renews it") {
  FaultEnv fault(kFault);
  auto o = test::with_test_faults(options());
  o.quarantine_cooldown = 500ms;
  auto host = test::start_host(o);
  Script bad = reg(*host, "bad", kCrashing);
  const auto before = std::chrono::steady_clock::now();
  crash_twice(*host, bad);
  const Result refused = get(host->evaluate(bad, {}));
  // Only when this machine was fast enough for the cool-down not to have passed already.
  if (std::chrono::steady_clock::now() - before < o.quarantine_cooldown)
    CHECK_MESSAGE(is_quarantine(refused), refused.error);
  REQUIRE(eventually([&] { return !host->script_crashes(bad).quarantined; }));
  // Over: the next evaluation reaches a worker again (and crashes it)...
  const Result again = get(host->evaluate(bad, {}));
  CHECK_MESSAGE(again.status == Status::worker_lost, again.error);
  CHECK(host->script_crashes(bad).crashes == 3);
  // ...and three crashes within crash_loop_window quarantine it again at once.
  CHECK(host->script_crashes(bad).quarantined);
  CHECK(host->shard_stats(0).state != "crash_loop");
  CHECK(host->shard_stats(0).crashes_charged == 3);
}

TEST_CASE("Quarantine: evaluations already waiting for the next worker are not sent to it") {
  FaultEnv fault(kFault);
  auto o = test::with_test_faults(options());
  o.single_flight = SingleFlight::off;
  o.retries = 5;  // without the quarantine, the third would be retried into a third crash
  auto host = test::start_host(o);
  Script bad = reg(*host, "bad", kCrashing);
  Collector col(3);
  for (std::size_t i = 0; i < 3; ++i) host->evaluate(bad, {}, col.at(i));
  REQUIRE(col.wait_all(30s));
  int lost = 0, quarantined = 0;
  for (const Result& r : col.results) {
    if (r.status == Status::worker_lost) ++lost;
    if (is_quarantine(r)) ++quarantined;
  }
  CHECK(lost == 2);
  CHECK(quarantined == 1);
  CHECK(host->shard_stats(0).deaths == 2);
  CHECK(host->shard_stats(0).quarantine_refusals == 1);
}

TEST_CASE("Quarantine: a SIGKILL from outside is nobody's crash: the script is not charged") {
  auto o = options();
  o.quarantine_after = 1;
  o.crash_loop_limit = 100;
  o.timeout = 5000ms;
  auto host = test::start_host(o);
  Script slow =
      reg(*host, "slow", "local t = os.clock() while os.clock() - t < 0.3 do end return 1");
  for (int i = 0; i < 2; ++i) {
    auto f = host->evaluate(slow, {});
    std::this_thread::sleep_for(100ms);  // inside `slow` now (if not, nothing is charged anyway)
    const int pid = host->worker_pids()[0];
    REQUIRE(pid > 0);  // kill(0, ...) would signal this test's own process group
    kill(pid, SIGKILL);
    CHECK(!get(std::move(f)).killed_worker);
  }
  CHECK(host->shard_stats(0).crashes_charged == 0);
  CHECK(host->script_crashes(slow).crashes == 0);
  const Result r = get(host->evaluate(slow, {}));
  CHECK_MESSAGE(r.status == Status::ok, r.error);
}

TEST_CASE("Quarantine: its options are validated") {
  std::unique_ptr<Host> host;
  HostOptions o = options();
  o.quarantine_after = 0;
  Error err = Host::create(o, &host);
  CHECK(err.code == ErrorCode::invalid_argument);
  CHECK(err.message.find("quarantine_after") != std::string::npos);
  o = options();
  o.quarantine_cooldown = 0ms;
  err = Host::create(o, &host);
  CHECK(err.code == ErrorCode::invalid_argument);
  CHECK(err.message.find("quarantine_cooldown") != std::string::npos);
  CHECK(!host);
}
