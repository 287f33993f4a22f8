// End-to-end tests of outrun::Host through real worker processes.
#include "outrun/host.h"

#include <dirent.h>
#include <doctest/doctest.h>
#include <signal.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <thread>

#include "host/host_support.h"
#include "outrun/in_process.h"
#include "test_support.h"

using namespace outrun;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Host> make_host(int shards = 2, std::chrono::milliseconds timeout = 1000ms,
                                SingleFlight single_flight = SingleFlight::refuse) {
  HostOptions o;
  o.shards = shards;
  o.timeout = timeout;
  o.grace = 5000ms;  // these tests are about results, not kills: never kill on a loaded machine
  o.single_flight = single_flight;
  o.worker_path = OUTRUN_TEST_WORKER;
  return test::start_host(o);
}

using test::reg;
using Tally = test::Collector;

// The corpus used for the out-of-process / InProcess comparison: results, errors, values.
std::string corpus_source(int i) {
  switch (i % 8) {
    case 0:
      return "return inputs.x * " + std::to_string(i) + " + 1";
    case 1:
      return "return (inputs.x + " + std::to_string(i) + ") / 2";
    case 2:
      return "return 'k' .. tostring(inputs.x) .. '-" + std::to_string(i) + "'";
    case 3:
      return "return { n = " + std::to_string(i) +
             ", list = { inputs.x, inputs.x + 1 }, ok = true }";
    case 4:
      return "local a = " + std::to_string(i) +
             "\nlocal b = nil\nreturn a + b";  // runtime error, line 3
    case 5:
      return "local t = {}\nfor k = 1, 10 do t[k] = k * inputs.x end\nreturn t";
    case 6:
      return "return " + std::to_string(i) + " +";  // compile error
    default:
      return "return string.format('%d:%.2f', " + std::to_string(i) + ", inputs.x / 3)";
  }
}

}  // namespace

TEST_CASE("Host: evaluates a script in a worker process") {
  auto host = make_host();
  Script s = reg(*host, "avg", "return (inputs.a + inputs.b) / 2");
  Result r = host->evaluate(s, {{"a", 1}, {"b", 2}}).get();
  CHECK(r.status == Status::ok);
  CHECK(r.value == Value(1.5));
  CHECK(r.shard == static_cast<int>(s.shard()));
  for (int pid : host->worker_pids()) CHECK(pid != getpid());
}

TEST_CASE("Host: 1,000 distinct scripts give correct results and match InProcess") {
  auto host = make_host(2);
  InProcess inproc;
  constexpr int kScripts = 1000;
  std::vector<Script> hs, is;
  for (int i = 0; i < kScripts; ++i) {
    hs.push_back(reg(*host, "s" + std::to_string(i), corpus_source(i)));
    is.push_back(reg(inproc, "s" + std::to_string(i), corpus_source(i)));
  }
  std::vector<Future> futures;
  for (int i = 0; i < kScripts; ++i) futures.push_back(host->evaluate(hs[i], {{"x", i}}));
  int shard_counts[2] = {0, 0};
  for (int i = 0; i < kScripts; ++i) {
    Result out = futures[i].get();
    Result in = inproc.run(is[i], {{"x", i}});
    INFO("script " << i << ": " << corpus_source(i));
    CHECK(out.status == in.status);
    CHECK(out.value == in.value);
    CHECK(out.error == in.error);
    ++shard_counts[out.shard];
    switch (i % 8) {
      case 0:
        CHECK(out.value == Value(int64_t{i} * i + 1));
        break;
      case 4:
        CHECK(out.status == Status::runtime_error);
        CHECK(out.error.find("s" + std::to_string(i) + ":3:") != std::string::npos);
        break;
      case 6:
        CHECK(out.status == Status::compile_error);
        CHECK(out.error.find("s" + std::to_string(i) + ":1:") != std::string::npos);
        break;
      default:
        CHECK(out.status == Status::ok);
    }
  }
  // Both shards took part (stable hash routing spreads keys).
  CHECK(shard_counts[0] > 100);
  CHECK(shard_counts[1] > 100);
}

TEST_CASE("Host: a script key always routes to the same shard") {
  auto host = make_host(2);
  Script a = reg(*host, "Line1.Temp.avg", "return 1");
  Script b = reg(*host, "Line1.Temp.avg", "return 2");  // new source, same key
  CHECK(a.shard() == b.shard());
  CHECK(a.sha256() != b.sha256());
  CHECK(host->evaluate(a, {}).get().value == Value(1));  // the old handle keeps its source
  CHECK(host->evaluate(b, {}).get().value == Value(2));
  Script c = reg(*host, "Line1.Temp.avg", "return 2");  // same key and source: same handle
  CHECK(c == b);                                        // the same record
}

TEST_CASE("Host: callbacks run once each, on a dispatcher thread") {
  auto host = make_host(2, 1000ms, SingleFlight::off);
  Script s = reg(*host, "double", "return inputs.x * 2");
  constexpr int kN = 2000;
  Tally tally(kN);
  const auto caller = std::this_thread::get_id();
  std::atomic<int> on_caller{0};
  for (int i = 0; i < kN; ++i) {
    host->evaluate(s, {{"x", i}}, [&, i](Result r) {
      if (std::this_thread::get_id() == caller) ++on_caller;
      tally.record(static_cast<std::size_t>(i), std::move(r));
    });
  }
  REQUIRE(tally.wait(kN));
  CHECK(on_caller == 0);
  for (int i = 0; i < kN; ++i) {
    CHECK(tally.calls[i] == 1);
    CHECK(tally.results[i].value == Value(int64_t{2} * i));
  }
}

TEST_CASE("Host: evaluate_batch answers every request once, in few frames") {
  auto host = make_host(2, 1000ms, SingleFlight::off);
  std::vector<Script> scripts;
  for (int k = 0; k < 10; ++k)
    scripts.push_back(
        reg(*host, "b" + std::to_string(k), "return inputs.x + " + std::to_string(k)));
  constexpr int kN = 5000;
  std::vector<Request> reqs;
  for (int i = 0; i < kN; ++i) reqs.push_back({scripts[i % 10], {{"x", i}}});
  Tally tally(kN);
  host->evaluate_batch(std::move(reqs),
                       [&](std::size_t i, Result r) { tally.record(i, std::move(r)); });
  REQUIRE(tally.wait(kN));
  for (int i = 0; i < kN; ++i) {
    CHECK(tally.calls[i] == 1);
    CHECK(tally.results[i].value == Value(int64_t{i} + i % 10));
  }
  // 5,000 evaluations went out as a handful of frames per shard, and came back as few.
  uint64_t frames = 0;
  for (int i = 0; i < host->shards(); ++i) frames += host->shard_stats(i).frames_read;
  CHECK(frames < 500);
}

TEST_CASE("Host: bad handles and bad inputs are invalid_argument, not a crash") {
  auto host = make_host(1);
  InProcess other;
  Script foreign = reg(other, "x", "return 1");
  CHECK(host->evaluate(foreign, {}).get().status == Status::invalid_argument);
  CHECK(host->evaluate(Script(), {}).get().status == Status::invalid_argument);

  Script s = reg(*host, "deep", "return 1");
  Value deep = Value(1);
  for (int i = 0; i < kMaxValueDepth + 2; ++i) deep = Value(Array{deep});
  Result r = host->evaluate(s, {{"d", deep}}).get();
  CHECK(r.status == Status::invalid_argument);
  CHECK(r.error.find("nested deeper") != std::string::npos);
  Inputs many;
  for (std::size_t i = 0; i <= kMaxInputs; ++i) many.push_back({"i" + std::to_string(i), 1});
  CHECK(host->evaluate(s, std::move(many)).get().status == Status::invalid_argument);

  Script tmp;
  CHECK(host->register_script("", "return 1", &tmp).code == ErrorCode::invalid_argument);
  CHECK(host->register_script(std::string(kMaxKeySize + 1, 'k'), "return 1", &tmp).code ==
        ErrorCode::invalid_argument);
  CHECK(host->register_script("big", std::string(kMaxSourceSize + 1, ' '), &tmp).code ==
        ErrorCode::invalid_argument);
  // The host still works.
  CHECK(host->evaluate(s, {}).get().status == Status::ok);
}

TEST_CASE("Host: large inputs and results cross the pipe intact") {
  auto host = make_host(1);
  Script s = reg(*host, "echo", "return inputs.v");
  std::string big(3u << 20, 'x');
  for (std::size_t i = 0; i < big.size(); i += 4096)
    big[i] = static_cast<char>('a' + (i / 4096) % 26);
  Result r = host->evaluate(s, {{"v", big}}).get();
  REQUIRE(r.status == Status::ok);
  CHECK(r.value == Value(big));
  Bytes bin{std::string("\xff\x00\x01", 3)};
  r = host->evaluate(s, {{"v", bin}}).get();
  CHECK(r.value == Value(bin));
}

TEST_CASE("Host: a soft timeout ends the evaluation and the worker survives") {
  auto host = make_host(1, 100ms);
  Script loop = reg(*host, "loop", "while true do end");
  Script ok = reg(*host, "ok", "return 7");
  const int pid = host->worker_pids()[0];
  Result r = host->evaluate(loop, {}).get();
  CHECK(r.status == Status::timeout);
  CHECK(r.error.find("timeout") != std::string::npos);
  CHECK(host->evaluate(ok, {}).get().value == Value(7));
  CHECK(host->worker_pids()[0] == pid);
}

TEST_CASE("Host: a worker killed from outside ends its evaluations once and restarts") {
  auto host = make_host(1, 5000ms, SingleFlight::off);
  Script slow = reg(*host, "slow", "local t = os.clock() while os.clock() - t < 2 do end return 1");
  Script ok = reg(*host, "ok", "return inputs.x");
  const int pid = host->worker_pids()[0];
  constexpr int kN = 50;
  Tally tally(kN + 1);
  host->evaluate(slow, {}, [&](Result r) { tally.record(kN, std::move(r)); });
  for (int i = 0; i < kN; ++i)
    host->evaluate(ok, {{"x", i}}, [&, i](Result r) { tally.record(i, std::move(r)); });
  std::this_thread::sleep_for(100ms);  // the worker is inside `slow` now
  REQUIRE(pid > 0);                    // kill(0, ...) would signal this test's own process group
  REQUIRE(kill(pid, SIGKILL) == 0);
  REQUIRE(tally.wait(kN + 1));
  // The one it was running when it died is the suspect and is not retried; the bystanders
  // behind it are retried once on the new worker and succeed.
  CHECK(tally.calls[kN] == 1);
  CHECK(tally.results[kN].status == Status::worker_lost);
  CHECK(tally.results[kN].error.find("signal 9") != std::string::npos);
  for (int i = 0; i < kN; ++i) {
    CHECK(tally.calls[i] == 1);
    CHECK(tally.results[i].status == Status::ok);
    CHECK(tally.results[i].value == Value(i));
  }
  CHECK(host->shard_stats(0).retried == kN);
  CHECK(host->shard_stats(0).crashed == 1);
  // The shard comes back with a new worker, and the script's source is sent to it again.
  Result r = host->evaluate(ok, {{"x", 5}}).get();
  CHECK(r.status == Status::ok);
  CHECK(r.value == Value(5));
  CHECK(host->worker_pids()[0] != pid);
  CHECK(host->shard_stats(0).starts == 2);
}

TEST_CASE("Host: shutdown leaves no worker processes and no file descriptors") {
  { auto warm_up = make_host(1); }  // libuv opens its process-wide signal pipe once
  const std::size_t fds_before = test::open_fd_count();
  std::vector<int> pids;
  {
    auto host = make_host(2);
    Script s = reg(*host, "x", "return 1");
    CHECK(host->evaluate(s, {}).get().status == Status::ok);
    pids = host->worker_pids();
  }
  for (int pid : pids) {
    REQUIRE(pid > 0);
    CHECK(kill(pid, 0) == -1);   // gone and reaped
    CHECK(kill(-pid, 0) == -1);  // and nothing left in its process group
  }
  CHECK(test::child_pids().empty());
  CHECK(test::open_fd_count() == fds_before);
}

TEST_CASE("Host: shutdown ends every in-flight evaluation exactly once") {
  constexpr int kN = 200;
  Tally tally(kN);
  {
    HostOptions o;
    o.shards = 2;
    o.worker_path = OUTRUN_TEST_WORKER;
    o.timeout = 5000ms;
    o.shutdown_timeout = 200ms;
    o.single_flight = SingleFlight::off;
    std::unique_ptr<Host> host;
    REQUIRE(!Host::create(o, &host));
    Script slow =
        reg(*host, "slow", "local t = os.clock() while os.clock() - t < 0.05 do end return 1");
    for (int i = 0; i < kN; ++i)
      host->evaluate(slow, {}, [&, i](Result r) { tally.record(i, std::move(r)); });
  }  // ~Host: the queue cannot finish in 200 ms
  CHECK(tally.done == kN);
  int ok = 0, cancelled = 0;
  for (int i = 0; i < kN; ++i) {
    CHECK(tally.calls[i] == 1);
    if (tally.results[i].status == Status::ok) ++ok;
    if (tally.results[i].status == Status::cancelled) ++cancelled;
  }
  CHECK(ok + cancelled == kN);
  CHECK(cancelled > 0);
  CHECK(test::child_pids().empty());
}

TEST_CASE("Host: create fails clearly for a missing worker or bad options") {
  HostOptions o;
  o.worker_path = "/nonexistent/outrun-worker";
  std::unique_ptr<Host> host;
  Error err = Host::create(o, &host);
  CHECK(err.code == ErrorCode::invalid_argument);
  CHECK(err.message.find("/nonexistent/outrun-worker") != std::string::npos);
  CHECK(!host);
  o.worker_path = "/bin/true";  // starts, but never says hello
  err = Host::create(o, &host);
  CHECK(err.code == ErrorCode::unavailable);
  CHECK(!host);
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = 0;
  CHECK(Host::create(o, &host).code == ErrorCode::invalid_argument);
  o.shards = 1;
  o.max_script_bytes = 0;
  CHECK(Host::create(o, &host).code == ErrorCode::invalid_argument);
  CHECK(test::child_pids().empty());
}

TEST_CASE("Host: registered scripts hold at most max_script_bytes, past it, unavailable") {
  HostOptions o;
  o.shards = 1;
  o.worker_path = OUTRUN_TEST_WORKER;
  // A record costs its key, source and chunk name (the key) plus kScriptRecordOverhead: four
  // of the records below (2 + 1,000 + 2 + overhead each) and 400 bytes to spare.
  const std::size_t record = 2 + 1000 + 2 + kScriptRecordOverhead;
  o.max_script_bytes = 4 * record + 400;
  auto host = test::start_host(o);
  // "return 1" padded with a comment to 1,000 bytes of source.
  auto source = [](int v) {
    std::string s = "return " + std::to_string(v) + " --";
    s.resize(1000, 'x');
    return s;
  };
  std::vector<Script> held;
  for (int i = 0; i < 4; ++i) held.push_back(reg(*host, "k" + std::to_string(i), source(i)));
  CHECK(host->registry_stats().scripts == 4);
  CHECK(host->registry_stats().bytes == 4 * record);
  // 4 records held: a fifth does not fit.
  Script s;
  Error err = host->register_script("k4", source(4), &s);
  CHECK(err.code == ErrorCode::unavailable);
  CHECK(err.message.find("max_script_bytes (" + std::to_string(o.max_script_bytes) + ")") !=
        std::string::npos);
  // Neither does a new source for a key already held (its old record stays valid)...
  CHECK(host->register_script("k0", source(40), &s).code == ErrorCode::unavailable);
  // ...but a script already held registers again, and whatever is held runs.
  CHECK(!host->register_script("k1", source(1), &s));
  CHECK(s == held[1]);                                    // the same record
  CHECK(!host->register_script("tiny", "return 7", &s));  // 4 + 8 + 4 + overhead still fit
  CHECK(host->evaluate(s, {}).get().value == Value(int64_t{7}));
  for (int i = 0; i < 4; ++i) CHECK(host->evaluate(held[i], {}).get().value == Value(int64_t{i}));
}

TEST_CASE("Host: workers survive the exit of the thread that created the host") {
  // PR_SET_PDEATHSIG fires when the forking *thread* exits: workers must be forked by the loop.
  std::unique_ptr<Host> host;
  std::thread([&] { host = make_host(2); }).join();
  const auto pids = host->worker_pids();
  std::this_thread::sleep_for(50ms);  // give a wrongly delivered death signal time to land
  Script s = reg(*host, "alive", "return 42");
  CHECK(host->evaluate(s, {}).get().value == Value(42));
  CHECK(host->worker_pids() == pids);
  for (int i = 0; i < host->shards(); ++i) CHECK(host->shard_stats(i).starts == 1);
}

TEST_CASE("Host: the deepest inputs and results allowed pass, like InProcess") {
  auto host = make_host(1);
  InProcess inproc;
  const std::string echo = "return inputs.v";
  Script hs = reg(*host, "echo", echo), is = reg(inproc, "echo", echo);
  Value v = Value(1);
  for (int i = 0; i < kMaxValueDepth; ++i) v = Value(Array{v});  // 32 containers around a scalar
  Result out = host->evaluate(hs, {{"v", v}}).get();
  Result in = inproc.run(is, {{"v", v}});
  CHECK(out.status == Status::ok);
  CHECK(out.value == v);
  CHECK(in.status == Status::ok);
  CHECK(in.value == v);
}

TEST_CASE("Host: worker_large_pages starts workers with mimalloc's large OS pages, restarts too") {
  auto env_of = [](int pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string flag = std::string("MIMALLOC_LARGE_OS_PAGES=1") + '\0';
  for (bool on : {false, true}) {
    CAPTURE(on);
    HostOptions o;
    o.shards = 1;
    o.worker_path = OUTRUN_TEST_WORKER;
    o.worker_large_pages = on;
    auto host = test::start_host(o);
    Script s = reg(*host, "lp", "local t = {} for i = 1, 1000 do t[i] = i end return #t");
    CHECK(host->evaluate(s, {}).get().value == Value(int64_t{1000}));
    const int pid = host->worker_pids().at(0);
    const std::string env = env_of(pid);
    CHECK(env.find("PATH=") != std::string::npos);  // the rest of the host's environment
    CHECK((env.find(flag) != std::string::npos) == on);
    REQUIRE(!host->kill_shard(0));  // the loop kills it and starts the next one
    int next = 0;
    for (int i = 0; i < 2000 && (next == 0 || next == pid); ++i) {
      next = host->worker_pids().at(0);
      std::this_thread::sleep_for(5ms);
    }
    REQUIRE(next != pid);
    CHECK(host->evaluate(s, {}).get().value == Value(int64_t{1000}));
    CHECK((env_of(next).find(flag) != std::string::npos) == on);
  }
}

// ---- Unregistration and freed records (design/decisions.md D-unreg).

namespace {

// Waits (bounded) until every shard's worker holds `want[i]` script states: Forget frames go
// out from the loop thread and the status page follows when the worker has read them.
bool wait_worker_scripts(Host& host, const std::vector<uint64_t>& want,
                         std::chrono::milliseconds limit = 20000ms) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    bool all = true;
    for (int i = 0; i < host.shards(); ++i)  // past `want` (the slow lane): none
      all &= host.shard_stats(i).worker_scripts ==
             (static_cast<std::size_t>(i) < want.size() ? want[static_cast<std::size_t>(i)] : 0);
    if (all) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
}

std::vector<uint64_t> worker_scripts(Host& host) {
  std::vector<uint64_t> v;
  for (int i = 0; i < host.shards(); ++i) v.push_back(host.shard_stats(i).worker_scripts);
  return v;
}

void check_unregister_semantics(Runner& r) {
  Script s = reg(r, "unreg.a", "return 1");
  CHECK(r.evaluate(s, {}).get().value == Value(int64_t{1}));
  CHECK(s.registered());
  CHECK(!r.unregister_script("unreg.a"));
  CHECK(!s.registered());
  Result res = r.evaluate(s, {}).get();
  CHECK(res.status == Status::invalid_argument);
  CHECK(res.error == "script 'unreg.a' was unregistered");
  // A batch says the same for that request, the others run.
  Script other = reg(r, "unreg.b", "return 2");
  std::vector<Request> batch;
  batch.push_back(Request{s, {}});
  batch.push_back(Request{other, {}});
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Result> got(2);
  int n = 0;
  r.evaluate_batch(std::move(batch), [&](std::size_t i, Result x) {
    std::lock_guard lock(mu);
    got[i] = std::move(x);
    ++n;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, 10s, [&] { return n == 2; }));
  }
  CHECK(got[0].status == Status::invalid_argument);
  CHECK(got[1].value == Value(int64_t{2}));
  // Unknown keys, and a key unregistered twice.
  Error e = r.unregister_script("unreg.never");
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK(e.message.find("unreg.never") != std::string::npos);
  CHECK(r.unregister_script("unreg.a").code == ErrorCode::invalid_argument);
  // The key registers again: a fresh record (the same source too), and it runs.
  Script again = reg(r, "unreg.a", "return 1");
  CHECK_FALSE(again == s);  // a new record
  CHECK(again.registered());
  CHECK(r.evaluate(again, {}).get().value == Value(int64_t{1}));
  CHECK(r.evaluate(s, {}).get().status == Status::invalid_argument);  // still the old one
  Script changed = reg(r, "unreg.a", "return 3");
  CHECK(r.evaluate(changed, {}).get().value == Value(int64_t{3}));
  CHECK(r.evaluate(again, {}).get().value == Value(int64_t{1}));  // replaced, not unregistered
}

}  // namespace

TEST_CASE("Host: unregister_script: its handles end invalid_argument, the key registers again") {
  auto host = make_host();
  check_unregister_semantics(*host);
}

TEST_CASE(
    "InProcess: unregister_script: its handles end invalid_argument, the key registers again") {
  InProcess inproc;
  check_unregister_semantics(inproc);
}

TEST_CASE("Host: an evaluation in flight when its script is unregistered finishes ok") {
  auto host = make_host(2, 5000ms);
  Script s = reg(*host, "unreg.slow", "local n = 0 for i = 1, 3e6 do n = n + 1 end return n");
  std::vector<Future> running;
  running.push_back(host->evaluate(s, {}));
  CHECK(!host->unregister_script("unreg.slow"));
  s = Script();  // the evaluation holds the record alone now
  Result r = running[0].get();
  CHECK(r.status == Status::ok);
  CHECK(r.value == Value(int64_t{3000000}));
  CHECK(host->registry_stats().scripts == 0);
  CHECK(wait_worker_scripts(*host, std::vector<uint64_t>(2, 0)));
}

TEST_CASE(
    "Host: 10,000 register/evaluate/unregister cycles give back every byte and worker state") {
  auto host = make_host(2);
  Script keep = reg(*host, "cycle.keep", "return 0");
  CHECK(host->evaluate(keep, {}).get().status == Status::ok);
  const RegistryStats before = host->registry_stats();
  REQUIRE(wait_worker_scripts(*host, worker_scripts(*host)));
  const std::vector<uint64_t> workers_before = worker_scripts(*host);
  for (int i = 0; i < 10000; ++i) {
    const std::string key = "cycle." + std::to_string(i);
    Script s = reg(*host, key, "return " + std::to_string(i));
    Result r = host->evaluate(s, {}).get();
    REQUIRE(r.status == Status::ok);
    REQUIRE(r.value == Value(int64_t{i}));
    REQUIRE(!host->unregister_script(key));
  }
  // The compile-only process holds a record until it reached it (skipped once unregistered).
  CHECK(test::eventually([&] { return host->compiler_stats().idle; }, 10s));
  const RegistryStats after = host->registry_stats();
  CHECK(after.scripts == before.scripts);
  CHECK(after.bytes == before.bytes);
  CHECK(wait_worker_scripts(*host, workers_before));
  uint64_t compiles = 0;
  for (int i = 0; i < host->shards(); ++i)
    compiles += host->shard_stats(i).worker_compiles + host->shard_stats(i).worker_bytecode_loads;
  CHECK(compiles >= 10000);
  CHECK(host->evaluate(keep, {}).get().value == Value(int64_t{0}));
}

TEST_CASE("InProcess: 10,000 register/evaluate/unregister cycles give back every byte") {
  InProcess inproc;
  Script keep = reg(inproc, "cycle.keep", "return 0");
  const RegistryStats before = inproc.registry_stats();
  for (int i = 0; i < 10000; ++i) {
    const std::string key = "cycle." + std::to_string(i);
    Script s = reg(inproc, key, "return " + std::to_string(i));
    REQUIRE(inproc.run(s, {}).value == Value(int64_t{i}));
    REQUIRE(!inproc.unregister_script(key));
  }
  CHECK(inproc.registry_stats().scripts == before.scripts);
  CHECK(inproc.registry_stats().bytes == before.bytes);
  CHECK(inproc.run(keep, {}).value == Value(int64_t{0}));
}

TEST_CASE("Host: replacing a key 1,000 times keeps the registry and the workers bounded") {
  auto host = make_host(2);
  Script s;
  for (int i = 0; i < 1000; ++i) {
    s = reg(*host, "replace.me", "return " + std::to_string(i));  // the old handle goes here
    REQUIRE(host->evaluate(s, {}).get().value == Value(int64_t{i}));
  }
  const RegistryStats st = host->registry_stats();
  CHECK(st.scripts == 1);
  CHECK(st.bytes == 2 * std::string("replace.me").size() + std::string("return 999").size() +
                        kScriptRecordOverhead);
  std::vector<uint64_t> one(2, 0);
  one[s.shard()] = 1;
  CHECK(wait_worker_scripts(*host, one));
  // A handle kept to an old source keeps it (and only it) alive, and it still runs.
  Script old = s;
  s = reg(*host, "replace.me", "return -1");
  CHECK(host->registry_stats().scripts == 2);
  CHECK(host->evaluate(old, {}).get().value == Value(int64_t{999}));
  old = Script();
  // Freed with its last handle; the loop may still hold it for a moment (the compile-only
  // process's answer for it, stored under a temporary reference: seen under ASan on a loaded
  // machine), so the count is waited for, not read once.
  CHECK(test::eventually([&] { return host->registry_stats().scripts == 1; }));
  CHECK(host->evaluate(s, {}).get().value == Value(int64_t{-1}));
}

TEST_CASE("Host: register, evaluate and unregister race from several threads") {
  auto host = make_host(2, 5000ms, SingleFlight::off);
  const RegistryStats before = host->registry_stats();
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  // Each thread cycles its own keys and also a shared key that the others unregister under it.
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 400; ++i) {
        const std::string key = "race." + std::to_string(t) + "." + std::to_string(i % 7);
        Script mine, shared;
        if (host->register_script(key, "return " + std::to_string(i), &mine)) ++bad;
        (void)host->register_script("race.shared", "return 'shared' .. " + std::to_string(i % 3),
                                    &shared);
        auto a = host->evaluate(mine, {});
        auto b = host->evaluate(shared, {});
        (void)host->unregister_script("race.shared");  // may be gone already
        if (i % 2 == 0 && host->unregister_script(key)) ++bad;
        if (a.get().status != Status::ok) ++bad;
        const Status sb = b.get().status;
        if (sb != Status::ok && sb != Status::invalid_argument) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
  for (int t = 0; t < 4; ++t)
    for (int k = 0; k < 7; ++k)
      (void)host->unregister_script("race." + std::to_string(t) + "." + std::to_string(k));
  (void)host->unregister_script("race.shared");
  CHECK(host->registry_stats().scripts == before.scripts);
  CHECK(host->registry_stats().bytes == before.bytes);
  CHECK(wait_worker_scripts(*host, std::vector<uint64_t>(2, 0)));
}

TEST_CASE("Host: log lines go to HostOptions::log, never to spdlog's default logger") {
  // An application's own default logger, which the library must leave alone.
  auto app_sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("app", app_sink));
  struct Restore {
    std::shared_ptr<spdlog::logger> lg;
    ~Restore() { spdlog::set_default_logger(lg); }
  } restore{previous};

  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> lines;
  HostOptions o;
  o.shards = 1;
  o.timeout = 50ms;
  o.grace = 100ms;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.log = [&](LogLevel level, std::string_view line) {
    std::lock_guard lock(mu);
    lines.emplace_back(level, std::string(line));
  };
  {
    auto host = test::start_host(o);
    // A C function the instruction hook cannot interrupt: only the T+G kill ends it.
    Script s = reg(*host, "slow", R"(return (("a"):rep(40000)):find(".-.-.-.-.-.-b"))");
    CHECK(host->evaluate(s, {}).get().status == Status::killed);
  }
  std::lock_guard lock(mu);
  bool killed_logged = false;
  for (const auto& [level, line] : lines)
    if (level == LogLevel::warn && line.find("was killed") != std::string::npos)
      killed_logged = true;
  CHECK(killed_logged);
  CHECK(app_sink->last_formatted().empty());
}
