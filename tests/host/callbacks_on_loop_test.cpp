// HostOptions::callbacks_on_loop: callbacks run where their results are read (the loop thread),
// refusals still go through the dispatcher, and a callback may submit and drill from there.
// Host::post_to_loop (an application's handles on that loop) and HostOptions::busy_poll.
#include <uv.h>

#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "host_support.h"

namespace outrun {
namespace {

using namespace std::chrono_literals;
using test::reg;

std::unique_ptr<Host> loop_host(bool callbacks_on_loop, int shards = 2) {
  HostOptions o;
  o.shards = shards;
  o.timeout = 1000ms;
  o.grace = 5000ms;
  o.single_flight = SingleFlight::off;
  o.callbacks_on_loop = callbacks_on_loop;
  o.worker_path = OUTRUN_TEST_WORKER;
  return test::start_host(o);
}

// The threads the callbacks of 400 evaluations spread over two shards ran on.
std::set<std::thread::id> callback_threads(Host& host, test::Collector* tally) {
  const std::pair<Script, Script> ab =
      test::scripts_on_shards_0_and_1(host, "t", "return inputs.x + 1");
  const Script a = ab.first, b = ab.second;
  std::mutex mu;
  std::set<std::thread::id> threads;
  for (int i = 0; i < 400; ++i) {
    host.evaluate(i % 2 ? a : b, {{"x", i}}, [&, i](Result r) {
      {
        std::lock_guard lock(mu);
        threads.insert(std::this_thread::get_id());
      }
      tally->record(static_cast<std::size_t>(i), std::move(r));
    });
  }
  REQUIRE(tally->wait_all());
  std::lock_guard lock(mu);
  return threads;
}

TEST_CASE("callbacks_on_loop: every shard's callbacks run once each on the one loop thread") {
  auto host = loop_host(true);
  test::Collector tally(400);
  const std::set<std::thread::id> threads = callback_threads(*host, &tally);
  CHECK(threads.size() == 1);  // both shards: the loop, not two dispatchers
  CHECK(threads.count(std::this_thread::get_id()) == 0);
  for (int i = 0; i < 400; ++i) {
    CHECK(tally.calls[i] == 1);
    CHECK(tally.results[i].value == Value(int64_t{i} + 1));
  }
}

TEST_CASE("callbacks_on_loop off: each shard's callbacks run on its own dispatcher") {
  auto host = loop_host(false);
  test::Collector tally(400);
  CHECK(callback_threads(*host, &tally).size() == 2);
}

TEST_CASE("callbacks_on_loop: refusals go through the dispatcher, deaths end on the loop") {
  auto host = loop_host(true, 1);
  Script s = reg(*host, "one", "return 1");
  std::thread::id loop_id;
  {
    std::promise<std::thread::id> where;
    host->evaluate(s, {}, [&](Result) { where.set_value(std::this_thread::get_id()); });
    loop_id = where.get_future().get();
  }
  // A refusal at submission (a handle of no host) runs on the dispatcher: not inside evaluate()
  // (the caller's thread), not on the loop.
  std::promise<std::thread::id> refused;
  host->evaluate(Script(), {}, [&](Result r) {
    CHECK(r.status == Status::invalid_argument);
    refused.set_value(std::this_thread::get_id());
  });
  const std::thread::id refused_on = refused.get_future().get();
  CHECK(refused_on != loop_id);
  CHECK(refused_on != std::this_thread::get_id());

  // What a worker's death ends is delivered where the death is seen: the loop.
  std::promise<std::pair<Status, std::thread::id>> lost;
  Script spin = reg(*host, "spin", "while true do end");
  host->evaluate(spin, {}, [&](Result r) {
    lost.set_value({r.status, std::this_thread::get_id()});
  });
  std::this_thread::sleep_for(100ms);  // running or not yet: either way it ends on the loop
  CHECK(!host->kill_shard(0));
  const std::pair<Status, std::thread::id> ended = lost.get_future().get();
  CHECK(ended.first != Status::ok);
  CHECK(ended.second == loop_id);
}

TEST_CASE("callbacks_on_loop: a callback may submit the next evaluation and drill") {
  auto host = loop_host(true, 1);
  Script s = reg(*host, "next", "return inputs.x + 1");
  constexpr int kChain = 300;
  std::promise<int64_t> last;
  std::function<void(Result)> step = [&](Result r) {
    REQUIRE(r.status == Status::ok);
    const int64_t x = r.value.as<int64_t>();
    if (x == kChain / 2) CHECK(!host->restart_shard(0));  // returns at once, from the loop too
    if (x >= kChain) {
      last.set_value(x);
      return;
    }
    host->evaluate(s, {{"x", x}}, step);
  };
  host->evaluate(s, {{"x", 0}}, step);
  CHECK(last.get_future().get() == kChain);
  CHECK(test::eventually([&] { return host->shard_stats(0).starts >= 2; }));
}

// after_loop_callbacks: on the loop, after each run of callbacks there; no callback runs after
// the last one; the ends of a death are a run too.
TEST_CASE("callbacks_on_loop: after_loop_callbacks ends every run of callbacks, on the loop") {
  HostOptions o;
  o.shards = 1;
  o.single_flight = SingleFlight::off;
  o.callbacks_on_loop = true;
  o.timeout = 300ms;  // the stuck one below is killed at T+G
  o.grace = 300ms;
  o.worker_path = OUTRUN_TEST_WORKER;
  // The loop thread's only (the callbacks' and the hook's); read once the Host is gone.
  int runs = 0, callbacks = 0;
  std::atomic<int> since_hook{0};  // also read by the test while the Host runs
  std::set<std::thread::id> hook_threads, callback_threads;
  o.after_loop_callbacks = [&] {
    hook_threads.insert(std::this_thread::get_id());
    if (since_hook.exchange(0) > 0) ++runs;
  };
  std::unique_ptr<Host> host = test::start_host(o);
  Script s = reg(*host, "hooked", "return inputs.x");
  // Stuck in one C call (pattern backtracking): no soft timeout can end it; the kill at T+G does,
  // from a death, which the Host ends on the loop.
  Script stuck =
      reg(*host, "stuck", "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')");
  constexpr int kN = 2000;
  std::atomic<int> left{kN + 1};
  std::vector<Request> batch;
  for (int i = 0; i < kN; ++i) batch.push_back(Request{s, {{"x", i}}});
  host->evaluate_batch(std::move(batch), [&](std::size_t, Result r) {
    CHECK(r.status == Status::ok);
    CHECK(host->on_loop_thread());
    callback_threads.insert(std::this_thread::get_id());
    ++since_hook;
    ++callbacks;
    --left;
  });
  CHECK(test::eventually([&] { return left.load() == 1; }));
  // The batch's last run of callbacks was followed by its hook, with nothing else happening.
  CHECK(test::eventually([&] { return since_hook.load() == 0; }));
  CHECK(!host->on_loop_thread());
  // A death's ends: the runaway is killed at T+G... here by kill_shard, which ends it on the loop.
  host->evaluate(stuck, {}, [&](Result r) {
    CHECK(r.status == Status::killed);  // at T+G: a death's end, on the loop
    callback_threads.insert(std::this_thread::get_id());
    ++since_hook;
    ++callbacks;
    --left;
  });
  CHECK(test::eventually([&] { return left.load() == 0; }));
  host.reset();
  CHECK(callbacks == kN + 1);
  CHECK(callback_threads.size() == 1);
  CHECK(hook_threads == callback_threads);
  CHECK(runs >= 2);
  CHECK(runs < kN);        // results arrive in runs, not one hook per callback
  CHECK(since_hook == 0);  // every callback was followed by a hook
}

// outrund's shape (design/daemon.md "One loop"): the application's own handle on the Host's
// loop submits from there, its results come back on the same thread, and it closes the handle
// before it destroys the Host.
TEST_CASE("post_to_loop: an application's timer on the Host's loop submits and is answered there") {
  auto host = loop_host(true);
  struct App {
    Host* host = nullptr;
    Script script;
    uv_timer_t timer{};
    std::thread::id loop_thread;
    std::atomic<int> ticks{0};
    std::promise<void> done;
    std::vector<Result> results;
    bool all_on_loop = true;
  } app;
  app.host = host.get();
  app.script = reg(*host, "tick", "return inputs.n * 10");
  std::promise<void> started;
  REQUIRE(host->post_to_loop([&](uv_loop_s* loop) {
    app.loop_thread = std::this_thread::get_id();
    CHECK(app.host->on_loop_thread());
    uv_timer_init(loop, &app.timer);
    app.timer.data = &app;
    uv_timer_start(
        &app.timer,
        [](uv_timer_t* t) {
          auto* a = static_cast<App*>(t->data);
          const int n = a->ticks++;
          if (n == 9) uv_timer_stop(t);
          a->host->evaluate(a->script, {{"n", n}}, [a](Result r) {
            a->all_on_loop = a->all_on_loop && std::this_thread::get_id() == a->loop_thread;
            a->results.push_back(std::move(r));
            if (a->results.size() == 10)
              uv_close(reinterpret_cast<uv_handle_t*>(&a->timer),
                       [](uv_handle_t* h) { static_cast<App*>(h->data)->done.set_value(); });
          });
        },
        1, 1);
    started.set_value();
  }));
  REQUIRE(started.get_future().wait_for(10s) == std::future_status::ready);
  CHECK(app.loop_thread != std::this_thread::get_id());
  REQUIRE(app.done.get_future().wait_for(10s) == std::future_status::ready);
  CHECK(app.all_on_loop);
  REQUIRE(app.results.size() == 10);
  for (int i = 0; i < 10; ++i) {
    CHECK(app.results[i].status == Status::ok);
    CHECK(app.results[i].value == Value(int64_t{i} * 10));
  }
  host.reset();  // the timer is closed: the loop ends
}

TEST_CASE("busy_poll: results stay exact with the loop polling, out of range is refused") {
  HostOptions o;
  o.shards = 2;
  o.single_flight = SingleFlight::off;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.busy_poll = std::chrono::microseconds(200);
  auto host = test::start_host(o);
  const Script s = reg(*host, "bp", "return inputs.x + 1");
  std::vector<Future> fs;
  for (int i = 0; i < 2000; ++i) fs.push_back(host->evaluate(s, {{"x", i}}));
  for (int i = 0; i < 2000; ++i) {
    Result r = fs[static_cast<std::size_t>(i)].get();
    CHECK(r.value == Value(int64_t{i} + 1));
  }
  for (int i = 0; i < 50; ++i)
    CHECK(host->evaluate_sync(s, {{"x", i}}).value == Value(int64_t{i} + 1));
  o.busy_poll = std::chrono::microseconds(10'001);
  CHECK(validate(o).code == ErrorCode::invalid_argument);
  o.busy_poll = std::chrono::microseconds(-1);
  CHECK(validate(o).code == ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace outrun
