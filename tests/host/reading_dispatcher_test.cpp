// HostOptions::dispatchers_read (design/threading.md "Reading dispatchers"), through the public
// API with real workers: a shard's dispatcher reads its own results after running callbacks,
// gives the read up before each callback, and the loop reads while one blocks.
#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include "host/host_support.h"

using namespace outrun;
using namespace std::chrono_literals;

namespace {

HostOptions reading_options(int shards) {
  HostOptions o;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = shards;
  o.timeout = 2000ms;
  o.grace = 2000ms;
  o.single_flight = SingleFlight::off;
  o.dispatchers_read = true;
  return o;
}

using test::Collector;
using test::eventually;
using test::reg;
using test::scripts_on_shards_0_and_1;

const char* kBusy50ms =
    "local t = os.clock() while os.clock() - t < 0.05 do end return inputs.x * 2";

// Runs callbacks on shard 0 until its dispatcher reads (it reads once it has run one).
void warm_up(Host& h, const Script& s) {
  Collector c(20);
  for (std::size_t i = 0; i < c.calls.size(); ++i)
    h.evaluate(s, {{"x", static_cast<int64_t>(i)}}, c.at(i));
  REQUIRE(c.wait_all(30s));
}

}  // namespace

TEST_CASE(
    "dispatchers_read: callbacks, futures, batches and evaluate_sync of two shards end once") {
  auto host = test::start_host(reading_options(2));
  const auto ab = scripts_on_shards_0_and_1(*host, "m", "return inputs.x * 2");
  const Script a = ab.first, b = ab.second;
  constexpr int kAsync = 3000;
  Collector c(kAsync);
  std::atomic<int> wrong{0}, on_loop{0};
  std::thread async([&] {
    std::vector<std::future<Result>> fs;
    for (int i = 0; i < kAsync; ++i) {
      const Script& s = i % 2 ? b : a;
      if (i % 3 != 1) {
        host->evaluate(s, {{"x", i}}, [&, i](Result r) {
          if (host->on_loop_thread()) ++on_loop;
          c.record(static_cast<std::size_t>(i), std::move(r));
        });
      } else {
        fs.push_back(host->evaluate(s, {{"x", i}}));
        c.record(static_cast<std::size_t>(i), Result{});
      }
      if (i % 100 == 0) std::this_thread::sleep_for(1ms);
    }
    for (auto& f : fs)
      if (f.wait_for(30s) != std::future_status::ready || f.get().status != Status::ok) ++wrong;
  });
  std::thread sync([&] {
    for (int i = 0; i < 500; ++i) {
      Result r = host->evaluate_sync(i % 2 ? b : a, {{"x", i}});
      if (r.status != Status::ok || r.value != Value(2 * i)) ++wrong;
    }
  });
  std::promise<void> batch_done;
  std::atomic<int> batch_ok{0};
  std::vector<Request> batch;
  for (int i = 0; i < 200; ++i) batch.push_back({i % 2 ? b : a, {{"x", i}}});
  host->evaluate_batch(std::move(batch), [&](std::size_t i, Result r) {
    if (r.status == Status::ok && r.value == Value(2 * static_cast<int64_t>(i))) ++batch_ok;
    if (i == 199) batch_done.set_value();  // a batch's callbacks run in order on each shard
  });
  async.join();
  sync.join();
  REQUIRE(c.wait_all(30s));
  REQUIRE(batch_done.get_future().wait_for(30s) == std::future_status::ready);
  for (int i = 0; i < kAsync; ++i) {
    CHECK(c.calls[static_cast<std::size_t>(i)] == 1);
    if (i % 3 != 1) CHECK(c.results[static_cast<std::size_t>(i)].value == Value(2 * i));
  }
  CHECK(wrong == 0);
  CHECK(on_loop == 0);
  CHECK(eventually([&] { return batch_ok == 200; }));
  CHECK(host->shard_stats(0).deaths == 0);
  CHECK(host->shard_stats(1).deaths == 0);
}

TEST_CASE("dispatchers_read: a callback that blocks delays no read of its own shard") {
  auto host = test::start_host(reading_options(1));
  Script quick = reg(*host, "quick", "return inputs.x * 2");
  Script slow = reg(*host, "slow", kBusy50ms);
  for (const bool in_flight : {false, true}) {
    CAPTURE(in_flight);
    warm_up(*host, quick);
    // The callback blocks until the test lets it go: meanwhile the shard's next results must be
    // read by someone else (the loop), or the future below never ends.
    std::promise<void> gate;
    std::shared_future<void> open = gate.get_future().share();
    std::atomic<bool> blocking{false};
    std::promise<Result> blocked_result;
    std::future<Result> later;
    if (in_flight) {
      // Sent before the callback runs: in flight when the dispatcher gives the read up.
      host->evaluate(quick, {{"x", 1}}, [&](Result r) {
        blocking = true;
        (void)open.wait_for(30s);
        blocked_result.set_value(std::move(r));
      });
      later = host->evaluate(slow, {{"x", 21}});
    } else {
      // Sent while the callback blocks: nothing was in flight when the read was given up.
      host->evaluate(quick, {{"x", 1}}, [&](Result r) {
        blocking = true;
        (void)open.wait_for(30s);
        blocked_result.set_value(std::move(r));
      });
      REQUIRE(eventually([&] { return blocking.load(); }));
      later = host->evaluate(slow, {{"x", 21}});
    }
    REQUIRE(eventually([&] { return blocking.load(); }));
    REQUIRE(later.wait_for(20s) == std::future_status::ready);
    const Result r = later.get();
    CHECK(r.status == Status::ok);
    CHECK(r.value == Value(42));
    // evaluate_sync of the same shard while the callback still blocks.
    CHECK(host->evaluate_sync(quick, {{"x", 5}}).value == Value(10));
    gate.set_value();
    std::future<Result> br = blocked_result.get_future();
    REQUIRE(br.wait_for(30s) == std::future_status::ready);
    CHECK(br.get().value == Value(2));
  }
  CHECK(host->shard_stats(0).deaths == 0);
}

TEST_CASE("dispatchers_read: kill_shard while the dispatcher reads: each evaluation ends once") {
  auto o = reading_options(1);
  o.restart_delay = 10ms;
  auto host = test::start_host(o);
  Script s = reg(*host, "k", "local t = os.clock() while os.clock() - t < 0.001 do end return 1");
  Collector c(600);
  std::thread killer([&] {
    for (int k = 0; k < 5; ++k) {
      std::this_thread::sleep_for(40ms);
      CHECK(!host->kill_shard(0));
    }
  });
  for (std::size_t i = 0; i < c.calls.size(); ++i) {
    host->evaluate(s, {}, c.at(i));
    if (i % 4 == 0) std::this_thread::sleep_for(1ms);
  }
  killer.join();
  REQUIRE(c.wait_all(30s));
  int ok = 0;
  for (std::size_t i = 0; i < c.calls.size(); ++i) {
    CHECK(c.calls[i] == 1);
    const Status st = c.results[i].status;
    CHECK((st == Status::ok || st == Status::worker_lost));
    ok += st == Status::ok;
  }
  CHECK(ok > 0);
  CHECK(host->shard_stats(0).killed_requested >= 1);
  CHECK(host->evaluate_sync(s, {}).value == Value(1));
}
