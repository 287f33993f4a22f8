// outrun::Future from a Host, through the public API with real workers: a caller blocked in
// get() reads its own result (leader/follower), a future submitted while the loop does not poll
// is read whether its caller waits, waits with a timeout, drops it or keeps it unread, and a
// future outlives its host (design/threading.md "A future's wait").
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "host/host_support.h"

using namespace outrun;
using namespace std::chrono_literals;

namespace {

// One shard; the watchdog wakes every min(T, silence_limit / 2): 20 s here, so nothing in these
// tests is read by it unless a case shortens T.
HostOptions quiet_options() {
  HostOptions o;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = 1;
  o.timeout = 20s;
  o.grace = 2s;
  o.silence_limit = 60s;
  o.single_flight = SingleFlight::off;
  return o;
}

using test::eventually;
using test::reg;

const char* kBusy5ms = "local t = os.clock() while os.clock() - t < 0.005 do end return inputs.x";

uint64_t in_flight(const Host& h) {
  return h.shard_stats(0).in_flight;
}
uint64_t left_to_caller(const Host& h) {
  return h.shard_stats(0).futures_left_to_caller;
}

// Sync round trips until the loop stopped polling for a leader and a future submitted now is
// left to its caller; returns that future (or an empty one after many tries).
Future future_left_to_caller(Host& h, const Script& s, int x) {
  for (int tries = 0; tries < 2000; ++tries) {
    for (int i = 0; i < 5; ++i) REQUIRE(h.evaluate_sync(s, {{"x", i}}).value == Value(i));
    const uint64_t before = left_to_caller(h);
    Future f = h.evaluate(s, {{"x", x}});
    if (left_to_caller(h) > before) return f;
    REQUIRE(f.get().value == Value(x));
  }
  return {};
}

}  // namespace

TEST_CASE("Future: get() gives what a callback gives, valid() false after, a move keeps it") {
  auto host = test::start_host(quiet_options());
  Script s = reg(*host, "id", "return inputs.x");
  Script bad = reg(*host, "bad", "error('no')");
  for (int i = 0; i < 200; ++i) {
    Future f = host->evaluate(s, {{"x", i}});
    REQUIRE(f.valid());
    Future g = std::move(f);
    CHECK_FALSE(f.valid());
    CHECK(g.get().value == Value(i));
    CHECK_FALSE(g.valid());
  }
  Result e = host->evaluate(bad, {}).get();
  CHECK(e.status == Status::runtime_error);
  CHECK(e.error.find("no") != std::string::npos);
  // Refused at submission (an empty handle): ends at once, no worker involved.
  CHECK(host->evaluate(Script{}, {}).get().status == Status::invalid_argument);
  // Callers that wait read their results themselves: after sync calls the loop stops polling,
  // and the futures submitted then are left to their callers (the one-wake-up path).
  Future f = future_left_to_caller(*host, s, 7);
  REQUIRE(f.valid());
  CHECK(f.get().value == Value(7));
  CHECK(in_flight(*host) == 0);
}

TEST_CASE("Future: left to its caller, then dropped, waited with a timeout, or never waited") {
  auto host = test::start_host(quiet_options());
  Script s = reg(*host, "id", "return inputs.x");

  SUBCASE("dropped unread: the loop reads it (not the 20 s watchdog)") {
    for (int round = 0; round < 5; ++round) {
      Future f = future_left_to_caller(*host, s, round);
      REQUIRE(f.valid());
      f = Future{};  // dropped
      CHECK(eventually([&] { return in_flight(*host) == 0; }, 5s));
    }
  }
  SUBCASE("a timed wait has the loop read it") {
    for (int round = 0; round < 5; ++round) {
      Future f = future_left_to_caller(*host, s, round);
      REQUIRE(f.valid());
      REQUIRE(f.wait_for(5s) == std::future_status::ready);
      CHECK(f.get().value == Value(round));
    }
  }
  SUBCASE("wait_for(0) polls: ready within a few seconds of polling") {
    Future f = future_left_to_caller(*host, s, 3);
    REQUIRE(f.valid());
    CHECK(eventually([&] { return f.wait_for(0ms) == std::future_status::ready; }, 5s));
    CHECK(f.get().value == Value(3));
  }
  SUBCASE("another evaluation submitted meanwhile has the loop read both") {
    Future f = future_left_to_caller(*host, s, 4);
    REQUIRE(f.valid());
    test::Collector c(1);
    host->evaluate(s, {{"x", 5}}, c.at(0));
    REQUIRE(c.wait_all(5s));
    CHECK(c.results[0].value == Value(5));
    CHECK(eventually([&] { return in_flight(*host) == 0; }, 5s));
    CHECK(f.get().value == Value(4));
  }
}

TEST_CASE("Future: left to its caller, its key's next evaluation has it read (single flight)") {
  SUBCASE("refuse: the next one may be busy, but not for long") {
    auto o = quiet_options();
    o.single_flight = SingleFlight::refuse;
    auto host = test::start_host(o);
    Script s = reg(*host, "id", "return inputs.x");
    for (int round = 0; round < 5; ++round) {
      Future f = future_left_to_caller(*host, s, round);
      REQUIRE(f.valid());
      CHECK(eventually(
          [&] {
            return host->evaluate_sync(s, {{"x", 1}}).status == Status::ok;
          },
          5s));
      CHECK(f.get().value == Value(round));
    }
  }
  SUBCASE("coalesce-latest: the one queued behind it ends") {
    auto o = quiet_options();
    o.single_flight = SingleFlight::coalesce_latest;
    auto host = test::start_host(o);
    Script s = reg(*host, "id", "return inputs.x");
    for (int round = 0; round < 5; ++round) {
      Future f = future_left_to_caller(*host, s, round);
      REQUIRE(f.valid());
      test::Collector c(1);
      host->evaluate(s, {{"x", 100 + round}}, c.at(0));
      REQUIRE(c.wait_all(5s));
      CHECK(c.results[0].value == Value(100 + round));
      CHECK(f.get().value == Value(round));
    }
  }
}

TEST_CASE("Future: two threads wait on one future at once, with and without a timeout") {
  auto host = test::start_host(quiet_options());
  Script slow = reg(*host, "slow", kBusy5ms);
  for (int round = 0; round < 50; ++round) {
    Future f = host->evaluate(slow, {{"x", round}});
    std::atomic<int> ready{0};
    std::thread a([&] {
      f.wait();
      ++ready;
    });
    std::thread b([&] {
      if (f.wait_for(10s) == std::future_status::ready) ++ready;
    });
    a.join();
    b.join();
    CHECK(ready == 2);
    CHECK(f.get().value == Value(round));
  }
  // The shard still reads: nobody kept the token.
  CHECK(host->evaluate_sync(slow, {{"x", 1}}).value == Value(1));
}

TEST_CASE("Future: wait_for and wait_until at the edges") {
  auto host = test::start_host(quiet_options());
  Script s = reg(*host, "id", "return inputs.x");
  Script spin =
      reg(*host, "spin", "local t = os.clock() while os.clock() - t < 0.3 do end return 1");
  Future f = host->evaluate(spin, {});
  CHECK(f.wait_for(0ms) == std::future_status::timeout);
  CHECK(f.wait_for(-5s) == std::future_status::timeout);
  CHECK(f.wait_for(std::chrono::duration<double>(std::nan(""))) == std::future_status::timeout);
  CHECK(f.wait_until(std::chrono::steady_clock::time_point::min()) == std::future_status::timeout);
  CHECK(f.wait_until(std::chrono::system_clock::now() - 1h) == std::future_status::timeout);
  CHECK(f.wait_for(std::chrono::hours::max()) == std::future_status::ready);
  CHECK(f.get().value == Value(1));
  Future g = host->evaluate(s, {{"x", 2}});
  CHECK(g.wait_until(std::chrono::system_clock::now() + 10s) == std::future_status::ready);
  CHECK(g.get().value == Value(2));
}

TEST_CASE("Future: kept unread, it is read by the shard's watchdog within T") {
  auto o = quiet_options();
  o.timeout = 300ms;  // the watchdog wakes every 300 ms
  o.grace = 300ms;
  auto host = test::start_host(o);
  Script s = reg(*host, "id", "return inputs.x");
  Future f = future_left_to_caller(*host, s, 9);
  REQUIRE(f.valid());
  CHECK(eventually([&] { return in_flight(*host) == 0; }, 5s));
  CHECK(f.get().value == Value(9));
}

TEST_CASE("Future: many threads each blocked in get() on one shard, mixed with sync callers") {
  auto host = test::start_host(quiet_options());
  Script s = reg(*host, "id", "return inputs.x");
  Script slow = reg(*host, "slow", kBusy5ms);
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 150; ++i) {
        const int x = t * 1000 + i;
        Result r = (t % 3 == 0)    ? host->evaluate_sync(s, {{"x", x}})
                   : (i % 10 == 0) ? host->evaluate(slow, {{"x", x}}).get()
                                   : host->evaluate(s, {{"x", x}}).get();
        if (r.status != Status::ok || r.value != Value(x)) ++wrong;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(wrong == 0);
  CHECK(in_flight(*host) == 0);
}

TEST_CASE("Future: a worker killed while a caller leads in get() ends it once, retried ok") {
  auto o = quiet_options();
  o.retries = 1;
  auto host = test::start_host(o);
  Script slow = reg(*host, "slow", kBusy5ms);
  for (int round = 0; round < 20; ++round) {
    Future f = host->evaluate(slow, {{"x", round}});
    std::thread killer([&] {
      std::this_thread::sleep_for(2ms);
      CHECK_FALSE(host->kill_shard(0));
    });
    const Result r = f.get();
    killer.join();
    CHECK((r.status == Status::ok || r.status == Status::worker_lost));
    if (r.status == Status::ok) CHECK(r.value == Value(round));
  }
}

TEST_CASE("Future: outlives its host, and a caller blocked in get() while the host goes") {
  auto o = quiet_options();
  o.shutdown_timeout = 100ms;
  Future later;
  std::atomic<int> status{-1};
  std::thread waiter;
  {
    auto host = test::start_host(o);
    Script spin = reg(*host, "spin", "while true do end");
    Future blocked = host->evaluate(spin, {});
    later = host->evaluate(spin, {});
    waiter = std::thread(
        [&status, f = std::move(blocked)]() mutable { status = static_cast<int>(f.get().status); });
    std::this_thread::sleep_for(50ms);  // the waiter is in get(), likely leading
    host.reset();
  }
  waiter.join();
  CHECK(status == static_cast<int>(Status::cancelled));
  // Its host is gone: the result is in, and reading it touches nothing of the host.
  REQUIRE(later.wait_for(0ms) == std::future_status::ready);
  CHECK(later.get().status == Status::cancelled);
}
