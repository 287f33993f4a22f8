// evaluate_sync and leader/follower (design/threading.md "Leader/follower"), through the public
// API with real workers: callers that wait read their shard's results themselves, mixed with
// callbacks, futures and batches, through kills, overruns, garbage and shutdown.
#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "host/host_support.h"
#include "outrun/in_process.h"

using namespace outrun;
using namespace std::chrono_literals;

namespace {

HostOptions base_options() {
  HostOptions o;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = 1;
  // Long enough that no honest evaluation overruns on a loaded machine (a 1 ms busy loop once
  // went past 100 + 100 ms while CI ran beside two builds); the overrun case sets its own.
  o.timeout = 2000ms;
  o.grace = 2000ms;
  o.single_flight = SingleFlight::off;
  return o;
}

using test::Collector;
using test::eventually;
using test::FaultEnv;
using test::reg;
using test::scripts_on_shards_0_and_1;

const char* kStuckInC = "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')";
const char* kBusy1ms =
    "local t = os.clock() while os.clock() - t < 0.001 do end return inputs.x * 2";

Result get(Future f, std::chrono::seconds limit = 30s) {
  REQUIRE(f.wait_for(limit) == std::future_status::ready);
  return f.get();
}

// Runs `body(t)` on `n` threads and joins them.
void on_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t) ts.emplace_back(body, t);
  for (auto& t : ts) t.join();
}

}  // namespace

TEST_CASE("Follower: evaluate_sync gives what evaluate gives") {
  auto host = test::start_host(base_options());
  Script s = reg(*host, "double", "return inputs.x * 2");
  Script bad = reg(*host, "bad", "error('no')");
  for (int i = 0; i < 100; ++i) {
    Result r = host->evaluate_sync(s, {{"x", i}});
    REQUIRE(r.status == Status::ok);
    CHECK(r.value == Value(2 * i));
    CHECK(r.shard == 0);
  }
  Result e = host->evaluate_sync(bad, {});
  CHECK(e.status == Status::runtime_error);
  CHECK(e.error.find("no") != std::string::npos);
  CHECK(host->evaluate_sync(Script(), {}).status == Status::invalid_argument);
  REQUIRE(!host->unregister_script("bad"));
  CHECK(host->evaluate_sync(bad, {}).status == Status::invalid_argument);
  InProcess ip;
  Script local = reg(ip, "double", "return inputs.x * 2");
  CHECK(ip.evaluate_sync(local, {{"x", 4}}).value == Value(8));
}

TEST_CASE("Follower: after sync calls (the loop stopped polling) callbacks, futures, batches end") {
  auto host = test::start_host(base_options());
  Script s = reg(*host, "double", "return inputs.x * 2");
  Script slow = reg(*host, "slow", kBusy1ms);
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 20; ++i) REQUIRE(host->evaluate_sync(s, {{"x", i}}).value == Value(2 * i));
    // Sent while the loop does not poll: each must wake it.
    CHECK(get(host->evaluate(s, {{"x", round}}), 10s).value == Value(2 * round));
    Collector c(3);
    host->evaluate(s, {{"x", 1}}, c.at(0));
    host->evaluate_batch({{s, {{"x", 2}}}, {slow, {{"x", 3}}}},
                         [&c](std::size_t i, Result r) { c.record(1 + i, std::move(r)); });
    REQUIRE(c.wait_all(10s));
    CHECK(c.results[0].value == Value(2));
    CHECK(c.results[1].value == Value(4));
    CHECK(c.results[2].value == Value(6));
    // A future in flight while a caller leads and returns before it: the loop must read it.
    auto f = host->evaluate(slow, {{"x", 5}});
    CHECK(host->evaluate_sync(s, {{"x", 6}}).value == Value(12));
    CHECK(get(std::move(f), 10s).value == Value(10));
  }
}

TEST_CASE("Follower: a future sent behind a leader's evaluation is read after the leader returns") {
  // The leader reads its own result, the loop stops polling meanwhile (it woke for that result
  // while the leader held the token), and the future's result comes later in its own frame:
  // giving the token up must make the loop poll again.
  auto host = test::start_host(base_options());
  Script lead = reg(*host, "lead", kBusy1ms);
  Script later = reg(*host, "later",
                     "local t = os.clock() while os.clock() - t < 0.003 do end return inputs.x");
  for (int round = 0; round < 100; ++round) {
    Future f;
    std::thread sender([&] {
      std::this_thread::sleep_for(200us);
      f = host->evaluate(later, {{"x", round}});
    });
    CHECK(host->evaluate_sync(lead, {{"x", round}}).value == Value(2 * round));
    sender.join();
    REQUIRE(f.wait_for(5s) == std::future_status::ready);
    CHECK(f.get().value == Value(round));
  }
}

TEST_CASE("Follower: many waiting threads on one shard and on two, with callbacks and futures") {
  auto o = base_options();
  o.shards = 2;
  auto host = test::start_host(o);
  // Not structured bindings: clang 14 cannot capture one.
  const auto ab = scripts_on_shards_0_and_1(*host, "m", "return inputs.x * 2");
  const auto slow = scripts_on_shards_0_and_1(*host, "slow", kBusy1ms);
  const Script a = ab.first, b = ab.second, sa = slow.first, sb = slow.second;
  constexpr int kThreads = 8, kEach = 300, kAsync = 2000;
  std::atomic<int> wrong{0};
  Collector c(kAsync);
  std::thread async([&] {
    std::vector<Future> fs;
    for (int i = 0; i < kAsync; ++i) {
      const Script& s = (i % 4 == 0) ? sa : (i % 4 == 1) ? sb : (i % 2 ? b : a);
      if (i % 3 == 0) {
        host->evaluate(s, {{"x", i}}, c.at(static_cast<std::size_t>(i)));
      } else {
        fs.push_back(host->evaluate(s, {{"x", i}}));
        c.record(static_cast<std::size_t>(i), Result{});  // counted once; checked below
      }
      if (i % 50 == 0) std::this_thread::sleep_for(1ms);
    }
    for (auto& f : fs)
      if (get(std::move(f)).status != Status::ok) ++wrong;
  });
  on_threads(kThreads, [&](int t) {
    for (int i = 0; i < kEach; ++i) {
      const int x = t * 1000 + i;
      // Thread 0 uses shard 0 only: it leads and follows on one shard while the others mix.
      const Script& s = (t == 0 || i % 2 == 0) ? a : b;
      Result r = host->evaluate_sync(i % 10 == 0 ? (t == 0 ? sa : sb) : s, {{"x", x}});
      if (r.status != Status::ok || r.value != Value(2 * x)) ++wrong;
    }
  });
  async.join();
  REQUIRE(c.wait_all(30s));
  for (int i = 0; i < kAsync; ++i) {
    CHECK(c.calls[static_cast<std::size_t>(i)] == 1);
    if (i % 3 == 0) CHECK(c.results[static_cast<std::size_t>(i)].value == Value(2 * i));
  }
  CHECK(wrong == 0);
  const ShardStats s0 = host->shard_stats(0), s1 = host->shard_stats(1);
  CHECK(s0.deaths == 0);
  CHECK(s1.deaths == 0);
}

TEST_CASE("Follower: a leader never runs a callback, callbacks_on_loop or not") {
  for (const bool on_loop : {false, true}) {
    CAPTURE(on_loop);
    auto o = base_options();
    o.callbacks_on_loop = on_loop;
    auto host = test::start_host(o);
    Script s = reg(*host, "double", "return inputs.x * 2");
    Script slow = reg(*host, "slow", kBusy1ms);
    std::atomic<std::thread::id> waiter{};
    std::atomic<int> on_waiter{0};
    constexpr int kN = 400;
    Collector c(kN);
    std::thread sync([&] {
      waiter = std::this_thread::get_id();
      for (int i = 0; i < 300; ++i) CHECK(host->evaluate_sync(s, {{"x", i}}).value == Value(2 * i));
    });
    for (int i = 0; i < kN; ++i) {
      host->evaluate(i % 2 ? s : slow, {{"x", i}}, [&, i](Result r) {
        if (std::this_thread::get_id() == waiter.load()) ++on_waiter;
        c.record(static_cast<std::size_t>(i), std::move(r));
      });
      if (i % 20 == 0) std::this_thread::sleep_for(1ms);
    }
    sync.join();
    REQUIRE(c.wait_all(30s));
    for (int i = 0; i < kN; ++i) {
      CHECK(c.calls[static_cast<std::size_t>(i)] == 1);
      CHECK(c.results[static_cast<std::size_t>(i)].value == Value(2 * i));
    }
    CHECK(on_waiter == 0);
  }
}

TEST_CASE("Follower: kill_shard while followers wait: each ends once, ok or worker_lost") {
  auto o = base_options();
  o.restart_delay = 10ms;
  auto host = test::start_host(o);
  Script s = reg(*host, "k", kBusy1ms);
  constexpr int kThreads = 6, kEach = 60;
  std::atomic<int> ok{0}, lost{0}, other{0};
  std::atomic<bool> stop{false};
  Collector c(200);
  std::thread killer([&] {
    for (int k = 0; k < 5 && !stop; ++k) {
      std::this_thread::sleep_for(30ms);
      CHECK(!host->kill_shard(0));
    }
  });
  std::thread async([&] {
    for (std::size_t i = 0; i < c.calls.size(); ++i) {
      host->evaluate(s, {{"x", static_cast<int64_t>(i)}}, c.at(i));
      std::this_thread::sleep_for(1ms);
    }
  });
  on_threads(kThreads, [&](int t) {
    for (int i = 0; i < kEach; ++i) {
      const int x = t * 1000 + i;
      Result r = host->evaluate_sync(s, {{"x", x}});
      if (r.status == Status::ok && r.value == Value(2 * x))
        ++ok;
      else if (r.status == Status::worker_lost)
        ++lost;
      else
        ++other;
    }
  });
  stop = true;
  killer.join();
  async.join();
  REQUIRE(c.wait_all(30s));
  for (std::size_t i = 0; i < c.calls.size(); ++i) {
    CHECK(c.calls[i] == 1);
    const Status st = c.results[i].status;
    CHECK((st == Status::ok || st == Status::worker_lost));
  }
  CHECK(ok + lost == kThreads * kEach);
  CHECK(other == 0);
  CHECK(host->shard_stats(0).killed_requested >= 1);
  CHECK(host->evaluate_sync(s, {{"x", 1}}).value == Value(2));
}

TEST_CASE("Follower: a T+G overrun while a follower waits ends `killed`, the others go on") {
  auto o = base_options();
  o.timeout = 100ms;
  o.grace = 100ms;
  auto host = test::start_host(o);
  Script stuck = reg(*host, "stuck", kStuckInC);
  Script s = reg(*host, "double", "return inputs.x * 2");
  std::atomic<int> wrong{0};
  std::atomic<bool> done{false};
  std::thread others([&] {
    for (int i = 0; !done; ++i) {
      Result r = host->evaluate_sync(s, {{"x", i}});
      // Sent behind the stuck one to its worker: retried on the next (ok), or lost.
      if (r.status != Status::ok && r.status != Status::worker_lost) ++wrong;
      if (r.status == Status::ok && r.value != Value(2 * i)) ++wrong;
    }
  });
  for (int k = 0; k < 2; ++k) {
    Result r = host->evaluate_sync(stuck, {});
    CHECK(r.status == Status::killed);
    CHECK(r.error.find("100 ms") != std::string::npos);
  }
  done = true;
  others.join();
  CHECK(wrong == 0);
  // The first kill moved `stuck` to the slow lane (D-slow-lane): the second was there.
  CHECK(host->shard_stats(0).killed_overrun == 1);
  CHECK(host->shard_stats(host->slow_lane_shard()).killed_overrun == 1);
  CHECK(host->evaluate_sync(s, {{"x", 21}}).value == Value(42));
}

TEST_CASE("Follower: garbage read by a follower is a protocol violation, the others are fine") {
  struct Case {
    const char* kind;
    Status status;
    const char* violation;
  };
  const Case cases[] = {
      {"bad-length", Status::worker_lost, "exceeds the maximum frame size"},
      {"bad-flatbuffer", Status::worker_lost, "failed verification"},
      {"unknown-id", Status::worker_lost, "answered an evaluation it was not running"},
      {"duplicate", Status::runtime_error, "answered an evaluation it was not running"},
      {"shared-string", Status::worker_lost, "sent results past the decode budget"},
      {"shared-keys", Status::worker_lost, "sent results past the decode budget"},
  };
  FaultEnv fault("garbage");
  auto o = test::with_test_faults(base_options());
  o.crash_loop_limit = 1000;
  // Each case ends by the violation, never by the deadline: under TSan on a loaded machine the
  // read of a shared-string frame took 13 s once (the decode copies 64 MiB before the budget
  // refuses it), and a kill at T+G would move `bad` to the slow lane.
  o.grace = 60000ms;
  auto host = test::start_host(o);
  Script s = reg(*host, "double", "return inputs.x * 2");
  Script bad = reg(*host, "bad", "return 1");
  for (const Case& c : cases) {
    CAPTURE(c.kind);
    const ShardStats before = host->shard_stats(0);
    std::atomic<int> wrong{0};
    std::atomic<bool> done{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; !done || i < 20; ++i) {
          const int x = t * 1000 + i;
          Result r = host->evaluate_sync(s, {{"x", x}});
          if (r.status != Status::ok || r.value != Value(2 * x)) ++wrong;
        }
      });
    std::this_thread::sleep_for(5ms);
    Result r = host->evaluate_sync(bad, {{"garbage", c.kind}});
    done = true;
    for (auto& t : ts) t.join();
    CHECK(r.status == c.status);
    CHECK(wrong == 0);  // retried on the next worker
    const ShardStats after = host->shard_stats(0);
    CHECK(after.protocol_violations - before.protocol_violations == 1);
    CHECK(after.last_death.find(c.violation) != std::string::npos);
    CHECK(host->evaluate_sync(s, {{"x", 21}}).value == Value(42));
  }
}

TEST_CASE("Follower: NeedSource re-sent by a leader, coalesced replacements end the waiters") {
  SUBCASE("forget-scripts") {
    FaultEnv fault("forget-scripts");
    auto host = test::start_host(test::with_test_faults(base_options()));
    Script s = reg(*host, "double", "return inputs.x * 2");
    on_threads(4, [&](int t) {
      for (int i = 0; i < 100; ++i)
        CHECK(host->evaluate_sync(s, {{"x", t + i}}).value == Value(2 * (t + i)));
    });
  }
  SUBCASE("coalesce-latest") {
    auto o = base_options();
    o.single_flight = SingleFlight::coalesce_latest;
    auto host = test::start_host(o);
    Script s = reg(*host, "slow", kBusy1ms);
    std::atomic<int> ok{0}, busy{0}, other{0};
    on_threads(6, [&](int t) {
      for (int i = 0; i < 50; ++i) {
        Result r = host->evaluate_sync(s, {{"x", t}});
        if (r.status == Status::ok && r.value == Value(2 * t))
          ++ok;
        else if (r.status == Status::busy)
          ++busy;
        else
          ++other;
      }
    });
    CHECK(ok + busy == 300);
    CHECK(ok > 0);
    CHECK(other == 0);
  }
}

TEST_CASE("Follower: ~Host after evaluate_sync calls returned leaves no worker") {
  std::vector<int> pids;
  {
    auto o = base_options();
    o.shards = 2;
    auto host = test::start_host(o);
    const auto ab = scripts_on_shards_0_and_1(*host, "d", "return inputs.x");
    const Script a = ab.first, b = ab.second;
    on_threads(4, [&](int t) {
      for (int i = 0; i < 50; ++i)
        CHECK(host->evaluate_sync(t % 2 ? a : b, {{"x", i}}).value == Value(i));
    });
    // One more in flight as the host goes (its future ends ok or cancelled).
    auto f = host->evaluate(a, {{"x", 1}});
    pids = host->worker_pids();
    host.reset();
    const Status st = f.get().status;
    CHECK((st == Status::ok || st == Status::cancelled));
  }
  for (int pid : pids) CHECK(eventually([&] { return test::process_gone(pid); }));
}
