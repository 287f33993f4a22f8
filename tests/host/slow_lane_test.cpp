// The slow lane (design/decisions.md D-slow-lane) through the public API, with real workers and
// real kills: a script that timed out or was killed runs on the lane's worker, so its honest
// neighbours on its home shard no longer wait behind it; it comes back after behaving.
#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host/host_support.h"
#include "outrun/host.h"
#include "outrun/tags.h"

using namespace outrun;
using namespace std::chrono_literals;

namespace {

HostOptions lane_options() {
  HostOptions o;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = 1;
  o.timeout = 100ms;
  o.grace = 5000ms;  // soft timeouts stay soft on a loaded machine (parallel CTest)
  return o;
}

const char* kRunaway = "while true do end";
const char* kHonest = "return inputs.x + 1";
// Spins (until its timeout) only when asked to.
const char* kSometimes = "if inputs.spin then while true do end end return 1";
const char* kStuckInC = "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')";

Result get(Future f, std::chrono::seconds limit = 30s) {
  REQUIRE(f.wait_for(limit) == std::future_status::ready);
  return f.get();
}

}  // namespace

TEST_CASE("Slow lane: after its first timeout a runaway no longer holds up its neighbour") {
  HostOptions o = lane_options();
  o.timeout = 1000ms;  // the window the neighbour gets while the runaway spins in the lane
  auto host = test::start_host(o);
  REQUIRE(host->shards() == 2);
  const int lane = host->slow_lane_shard();
  REQUIRE(lane == 1);
  CHECK(host->shard_stats(lane).slow_lane);
  CHECK_FALSE(host->shard_stats(0).slow_lane);
  Script runaway = test::reg(*host, "runaway", kRunaway);
  Script honest = test::reg(*host, "honest", kHonest);
  REQUIRE(runaway.shard() == 0);
  REQUIRE(honest.shard() == 0);
  CHECK(host->shard_of(runaway) == 0);

  // Its first evaluation runs on its home shard (nobody knew), times out and moves it.
  Result first = host->evaluate(runaway, {}).get();
  CHECK(first.status == Status::timeout);
  CHECK(first.shard == 0);
  CHECK(host->script_crashes(runaway).slow_lane);
  CHECK(host->shard_of(runaway) == lane);
  CHECK(host->shard_of(honest) == 0);
  CHECK(host->slow_lane_stats().moves_in == 1);
  CHECK(host->slow_lane_stats().scripts == 1);

  // Its next one spins in the lane for T; meanwhile the neighbour is served on shard 0.
  Future next = host->evaluate(runaway, {});
  int served = 0;
  for (int i = 0; i < 20; ++i) {
    Result r = host->evaluate_sync(honest, {{"x", i}});
    CHECK(r.status == Status::ok);
    CHECK(r.shard == 0);
    served += r.status == Status::ok;
  }
  CHECK(served == 20);
  // Every one of them ended while the runaway's evaluation was still running.
  CHECK(next.wait_for(0ms) == std::future_status::timeout);
  Result second = get(std::move(next));
  CHECK(second.status == Status::timeout);
  CHECK(second.shard == lane);
  CHECK(host->slow_lane_stats().evaluations == 1);
  CHECK(host->shard_stats(0).deaths == 0);
  CHECK(host->shard_stats(lane).deaths == 0);
}

TEST_CASE("Slow lane: off, the neighbour waits behind the runaway (the lane is what helps)") {
  HostOptions o = lane_options();
  o.timeout = 1000ms;
  o.slow_lane = false;
  auto host = test::start_host(o);
  CHECK(host->shards() == 1);
  CHECK(host->slow_lane_shard() == -1);
  Script runaway = test::reg(*host, "runaway", kRunaway);
  Script honest = test::reg(*host, "honest", kHonest);
  CHECK(host->evaluate(runaway, {}).get().status == Status::timeout);
  CHECK_FALSE(host->script_crashes(runaway).slow_lane);
  Future next = host->evaluate(runaway, {});
  Result r = host->evaluate_sync(honest, {{"x", 1}});
  CHECK(r.status == Status::ok);
  // One worker, one evaluation at a time: the neighbour's result came after the runaway's.
  CHECK(next.wait_for(0ms) == std::future_status::ready);
  CHECK(next.get().status == Status::timeout);
  CHECK(host->slow_lane_stats().shard == -1);
}

TEST_CASE("Slow lane: a script comes back to its home shard after behaving in the lane") {
  HostOptions o = lane_options();
  o.slow_lane_release_after = 3;
  auto host = test::start_host(o);
  const int lane = host->slow_lane_shard();
  Script s = test::reg(*host, "sometimes", kSometimes);
  CHECK(host->evaluate(s, {{"spin", true}}).get().status == Status::timeout);
  REQUIRE(host->shard_of(s) == lane);
  // Two behave, then a timeout in the lane starts the count again.
  for (int i = 0; i < 2; ++i) CHECK(host->evaluate(s, {}).get().shard == lane);
  Result again = host->evaluate(s, {{"spin", true}}).get();
  CHECK(again.status == Status::timeout);
  CHECK(again.shard == lane);
  for (int i = 0; i < 2; ++i) CHECK(host->evaluate(s, {}).get().shard == lane);
  CHECK(host->shard_of(s) == lane);
  Result third = host->evaluate(s, {}).get();  // the third in a row
  CHECK(third.status == Status::ok);
  CHECK(third.shard == lane);
  CHECK(host->shard_of(s) == 0);
  CHECK_FALSE(host->script_crashes(s).slow_lane);
  Result home = host->evaluate(s, {}).get();
  CHECK(home.status == Status::ok);
  CHECK(home.shard == 0);
  const SlowLaneStats st = host->slow_lane_stats();
  CHECK(st.moves_in == 1);
  CHECK(st.moves_out == 1);
  CHECK(st.scripts == 0);
  CHECK(st.evaluations == 6);
}

TEST_CASE("Slow lane: a script killed at T+G moves too, a batch and a future follow it") {
  HostOptions o = lane_options();
  o.grace = 100ms;
  auto host = test::start_host(o);
  const int lane = host->slow_lane_shard();
  Script stuck = test::reg(*host, "stuck", kStuckInC);
  Script honest = test::reg(*host, "honest", kHonest);
  Result r = get(host->evaluate(stuck, {}));
  CHECK(r.status == Status::killed);
  CHECK(r.shard == 0);
  CHECK(host->shard_of(stuck) == lane);
  // In the lane it is killed again, and the honest script's evaluations are not its bystanders.
  std::vector<Request> batch;
  batch.push_back(Request{stuck, {}, {}});
  batch.push_back(Request{honest, {{"x", 2}}, {}});
  std::mutex mu;
  std::vector<Result> got(2);
  std::atomic<int> ended{0};
  host->evaluate_batch(std::move(batch), [&](std::size_t i, Result res) {
    std::lock_guard<std::mutex> lock(mu);
    got[i] = std::move(res);
    ended.fetch_add(1);
  });
  REQUIRE(test::eventually([&] { return ended.load() == 2; }, 30s));
  std::lock_guard<std::mutex> lock(mu);
  CHECK(got[0].status == Status::killed);
  CHECK(got[0].shard == lane);
  CHECK(got[1].status == Status::ok);
  CHECK(got[1].shard == 0);
  CHECK(host->shard_stats(0).killed_overrun == 1);
  CHECK(host->shard_stats(lane).killed_overrun == 1);
  CHECK(host->shard_stats(0).retried == 0);
}

TEST_CASE("Slow lane: bounded, a flood of a runaway ends busy at once, each evaluation once") {
  HostOptions o = lane_options();
  o.single_flight = SingleFlight::off;
  o.slow_lane_max_in_flight = 3;
  auto host = test::start_host(o);
  const int lane = host->slow_lane_shard();
  Script runaway = test::reg(*host, "runaway", kRunaway);
  CHECK(host->evaluate(runaway, {}).get().status == Status::timeout);
  REQUIRE(host->shard_of(runaway) == lane);
  constexpr int kFlood = 20;
  std::mutex mu;
  std::vector<int> ends(kFlood, 0);
  std::vector<Status> status(kFlood, Status::ok);
  std::atomic<int> total{0};
  for (int i = 0; i < kFlood; ++i)
    host->evaluate(runaway, {}, [&, i](Result res) {
      std::lock_guard<std::mutex> lock(mu);
      ++ends[static_cast<std::size_t>(i)];
      status[static_cast<std::size_t>(i)] = res.status;
      total.fetch_add(1);
    });
  REQUIRE(test::eventually([&] { return total.load() == kFlood; }, 30s));
  std::this_thread::sleep_for(50ms);  // a second end of any of them would show now
  std::lock_guard<std::mutex> lock(mu);
  int timeouts = 0, busy = 0;
  for (int i = 0; i < kFlood; ++i) {
    CHECK(ends[static_cast<std::size_t>(i)] == 1);
    timeouts += status[static_cast<std::size_t>(i)] == Status::timeout;
    busy += status[static_cast<std::size_t>(i)] == Status::busy;
  }
  CHECK(timeouts == 3);
  CHECK(busy == kFlood - 3);
  CHECK(host->slow_lane_stats().refused_full == kFlood - 3);
  CHECK(host->shard_stats(lane).in_flight == 0);
}

TEST_CASE("Slow lane: its worker killed mid-run is restarted and serves the lane again") {
  HostOptions o = lane_options();
  o.timeout = 2000ms;
  auto host = test::start_host(o);
  const int lane = host->slow_lane_shard();
  Script runaway = test::reg(*host, "runaway", kRunaway);
  Script honest = test::reg(*host, "honest", kHonest);
  CHECK(host->evaluate(runaway, {}).get().status == Status::timeout);
  REQUIRE(host->shard_of(runaway) == lane);
  const int pid = host->worker_pids()[static_cast<std::size_t>(lane)];
  REQUIRE(pid > 0);
  Future spinning = host->evaluate(runaway, {});
  // Kill the lane's worker from outside, as an operator would, while it spins (it started
  // running it within 300 ms of its 2 s, unless the machine is very loaded: then it was a
  // bystander, retried on the next worker, and ends `timeout` there; once either way).
  REQUIRE(test::eventually([&] { return host->shard_stats(lane).in_flight == 1; }));
  std::this_thread::sleep_for(300ms);
  REQUIRE(kill(pid, SIGKILL) == 0);
  Result lost = get(std::move(spinning));
  CHECK((lost.status == Status::worker_lost || lost.status == Status::timeout));
  CHECK(lost.shard == lane);
  CHECK(test::eventually([&] {
    const int now = host->worker_pids()[static_cast<std::size_t>(lane)];
    return now != 0 && now != pid;
  }));
  CHECK(host->shard_stats(lane).starts == 2);
  CHECK(host->shard_stats(lane).crashed == 1);
  CHECK(host->shard_stats(0).deaths == 0);
  // Still in the lane (a SIGKILL from outside charges nobody), served by the new worker.
  CHECK(host->shard_of(runaway) == lane);
  Result again = get(host->evaluate(runaway, {}));
  CHECK(again.status == Status::timeout);
  CHECK(again.shard == lane);
  CHECK(host->evaluate(honest, {{"x", 1}}).get().value == Value(2));
}

TEST_CASE("Slow lane: a tag whose script runs away stops delaying the other tags") {
  HostOptions o = lane_options();
  o.timeout = 1000ms;
  auto host = test::start_host(o);
  const int lane = host->slow_lane_shard();
  std::mutex mu;
  std::vector<std::string> changed;
  tags::TagsOptions to;
  to.on_change = [&](const std::vector<tags::Change>& batch) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& c : batch) changed.push_back(c.tag);
  };
  std::unique_ptr<tags::Engine> engine;
  REQUIRE(!tags::Engine::create(*host, to, &engine));
  const auto define = [&](const std::string& id, const std::string& script,
                          const std::string& input) {
    tags::TagDefinition d;
    d.id = id;
    d.script = script;
    tags::InputSpec in;
    in.tag = input;
    d.inputs.push_back(in);
    d.type.type = tags::DataType::Double;
    Error e = engine->define(d);
    REQUIRE_MESSAGE(!e, e.message);
  };
  // Two components (In, X): their waves are independent; their scripts share shard 0.
  define("Runaway", "if inputs.In > 1 then while true do end end return inputs.In", "In");
  define("Double", "return inputs.X * 2", "X");
  const auto update = [&](const std::string& id, double v) {
    tags::SourceUpdate u;
    u.tag = id;
    u.value.value = Value(v);
    u.value.status = tags::codes::Good;
    REQUIRE(!engine->update({u}));
  };
  const auto count = [&](const std::string& id) {
    std::lock_guard<std::mutex> lock(mu);
    return std::count(changed.begin(), changed.end(), id);
  };
  update("In", 2);  // its first run away: on shard 0, a timeout moves it to the lane
  REQUIRE(engine->wait_idle(30s));
  REQUIRE(host->slow_lane_stats().moves_in == 1);
  update("In", 3);  // runs away again, now in the lane
  REQUIRE(test::eventually([&] { return host->shard_stats(lane).in_flight == 1; }));
  for (int i = 1; i <= 10; ++i) {
    update("X", i);
    REQUIRE(test::eventually([&] { return count("Double") == i; }, 30s));
  }
  // Every change of Double came while the runaway's wave was still running in the lane.
  CHECK(host->shard_stats(lane).in_flight == 1);
  CHECK(host->shard_stats(0).in_flight == 0);
  REQUIRE(engine->wait_idle(30s));
  tags::DataValue dv;
  REQUIRE(!engine->read("Double", &dv));
  CHECK(dv.value == Value(20.0));
}

TEST_CASE("Slow lane: a script that crashed its worker moves there, its neighbours stay home") {
  test::FaultEnv fault("crash-on-source=CRASH-ME");  // outrun-test-worker: SIGSEGV on that source
  HostOptions o = test::with_test_faults(lane_options());
  o.timeout = 2000ms;
  o.restart_delay = 5ms;
  auto host = test::start_host(o);
  const int lane = host->slow_lane_shard();
  Script bad = test::reg(*host, "bad", "return 'CRASH-ME'");
  Script honest = test::reg(*host, "honest", kHonest);
  Result first = get(host->evaluate(bad, {}));
  CHECK(first.status == Status::worker_lost);
  CHECK(first.shard == 0);
  CHECK(host->shard_of(bad) == lane);
  // Its second crash is the lane worker's, and quarantines it there; shard 0 died once.
  Result second = get(host->evaluate(bad, {}));
  CHECK(second.status == Status::worker_lost);
  CHECK(second.shard == lane);
  CHECK(host->script_crashes(bad).quarantined);
  CHECK(host->shard_stats(0).deaths == 1);
  CHECK(host->shard_stats(lane).crashes_charged == 1);
  Result r = get(host->evaluate(honest, {{"x", 1}}));
  CHECK(r.value == Value(2));
  CHECK(r.shard == 0);
}
