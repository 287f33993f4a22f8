// Supervision through the public API, with real workers: deadlines, kills, heartbeats,
// restarts, crash loops, single flight, dispatchers.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "host/host_support.h"
#include "outrun/host.h"
#include "test_support.h"

using namespace outrun;
using namespace std::chrono_literals;

namespace {

HostOptions base_options() {
  HostOptions o;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = 1;
  o.timeout = 100ms;
  o.grace = 100ms;
  return o;
}

std::unique_ptr<Host> start(const HostOptions& o) {
  return test::start_host(o);
}
using test::Collector;
using test::eventually;
using test::FaultEnv;
using test::process_gone;
using test::reg;
using test::scripts_on_shards_0_and_1;

// A script stuck inside one C call: Lua's pattern matcher backtracking, which the count hook
// cannot interrupt. Only the hard kill at T+G ends it.
const char* kStuckInC = "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')";

// A result, or a test failure (not a hang) when it does not come.
Result get(Future f, std::chrono::seconds limit = 30s) {
  REQUIRE(f.wait_for(limit) == std::future_status::ready);
  return f.get();
}

// utime + stime of a process, in clock ticks.
long cpu_ticks(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto p = line.rfind(')');
  if (p == std::string::npos) return 0;
  std::istringstream in(line.substr(p + 2));
  std::string f;
  long ticks = 0;
  for (int i = 3; i <= 15 && in >> f; ++i)
    if (i == 14 || i == 15) ticks += std::stol(f);
  return ticks;
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/outrun-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  // An executable shell script standing in for the worker.
  std::string script(const std::string& name, const std::string& body) const {
    const auto p = path / name;
    std::ofstream(p) << "#!/bin/sh\n" << body << "\n";
    chmod(p.c_str(), 0755);
    return p.string();
  }
};

}  // namespace

TEST_CASE("Supervision: runaway Lua ends `timeout` by the soft limit, however it is wrapped") {
  auto o = base_options();
  o.grace = 5000ms;  // a loaded machine (parallel CTest) must not turn a soft timeout into a kill
  auto host = start(o);
  const int pid = host->worker_pids()[0];
  const char* cases[] = {
      "while true do end",
      "pcall(function() while true do end end) return 'swallowed'",
      "while true do pcall(function() while true do end end) end",
      "xpcall(function() while true do end end, function() while true do end end) return 1",
      "local co = coroutine.wrap(function() while true do end end) co() return 1",
      "while true do local ok = coroutine.resume(coroutine.create(function() while true do end "
      "end)) end",
      "do local x <close> = setmetatable({}, {__close = function() while true do end end}) "
      "error('x') end",
      "local function f() return pcall(f) end while true do f() end",
      "error(setmetatable({}, {__tostring = function() while true do end end}))",
  };
  int i = 0;
  for (const char* src : cases) {
    INFO(src);
    Script s = reg(*host, "runaway" + std::to_string(i++), src);
    Result r = host->evaluate(s, {}).get();
    if (std::string(src).rfind("error(setmetatable", 0) == 0) {
      CHECK(r.status == Status::runtime_error);  // __tostring is never run
    } else {
      CHECK(r.status == Status::timeout);
    }
  }
  CHECK(host->worker_pids()[0] == pid);  // all soft: the worker never died
  CHECK(host->shard_stats(0).deaths == 0);
}

TEST_CASE("Supervision: a script stuck in one C call is killed at T+G and the shard recovers") {
  auto host = start(base_options());
  const int pid = host->worker_pids()[0];
  Script stuck = reg(*host, "stuck", kStuckInC);
  Script ok = reg(*host, "ok", "return inputs.x + 1");
  Result r = get(host->evaluate(stuck, {}));
  CHECK(r.status == Status::killed);
  CHECK(r.error.find("100 ms") != std::string::npos);
  CHECK(eventually([&] { return process_gone(pid); }));  // SIGKILL was sent before the answer
  CHECK(eventually([&] { return host->worker_pids()[0] != 0; }));
  Result next = host->evaluate(ok, {{"x", 1}}).get();
  CHECK(next.status == Status::ok);
  CHECK(next.value == Value(2));
  const ShardStats st = host->shard_stats(0);
  CHECK(st.killed_overrun == 1);
  CHECK(st.starts == 2);
}

TEST_CASE("Supervision: one runaway among 100 in flight: exactly one killed, the rest ok") {
  auto o = base_options();
  auto host = start(o);
  Script stuck = reg(*host, "stuck", kStuckInC);
  std::vector<Script> others;
  for (int i = 0; i < 99; ++i)
    others.push_back(reg(*host, "n" + std::to_string(i), "return inputs.x * 2"));
  Collector c(100);
  for (int i = 0; i < 50; ++i) host->evaluate(others[i], {{"x", i}}, c.at(i));
  host->evaluate(stuck, {}, c.at(50));
  for (int i = 50; i < 99; ++i) host->evaluate(others[i], {{"x", i}}, c.at(i + 1));
  REQUIRE(c.wait_all());
  int killed = 0, ok = 0;
  for (int i = 0; i < 100; ++i) {
    CHECK(c.calls[i] == 1);  // none lost, none duplicated
    if (c.results[i].status == Status::killed) ++killed;
    CHECK(c.results[i].killed_worker == (i == 50));  // the one that overran, not the bystanders
    if (c.results[i].status == Status::ok) {
      ++ok;
      const int x = i < 50 ? i : i - 1;
      CHECK(c.results[i].value == Value(2 * x));
    }
  }
  CHECK(killed == 1);
  CHECK(c.results[50].status == Status::killed);
  CHECK(ok == 99);
}

TEST_CASE("Supervision: slow evaluations queued behind each other never get their worker killed") {
  auto o = base_options();
  o.timeout = 400ms;
  o.grace = 100ms;
  auto host = start(o);
  // Each takes ~60 ms of CPU; twenty of them queue for ~1.2 s, far past T+G from submission.
  constexpr int kN = 20;
  std::vector<Script> slow;
  for (int i = 0; i < kN; ++i)
    slow.push_back(
        reg(*host, "slow" + std::to_string(i),
            "local t = os.clock() while os.clock() - t < 0.06 do end return " + std::to_string(i)));
  Collector c(kN);
  for (int i = 0; i < kN; ++i) host->evaluate(slow[i], {}, c.at(i));
  REQUIRE(c.wait_all());
  for (int i = 0; i < kN; ++i) {
    CHECK(c.results[i].status == Status::ok);
    CHECK(c.results[i].value == Value(i));
  }
  CHECK(host->shard_stats(0).deaths == 0);
}

TEST_CASE(
    "Supervision: a stopped (SIGSTOP) worker is killed for silence, its evaluations are retried") {
  auto o = base_options();
  o.heartbeat_interval = 50ms;
  o.silence_limit = 400ms;
  o.timeout = 5000ms;  // the deadline must not be what catches it
  auto host = start(o);
  Script s = reg(*host, "s", "return inputs.x");
  CHECK(host->evaluate(s, {{"x", 1}}).get().status == Status::ok);
  const int pid = host->worker_pids()[0];
  REQUIRE(pid > 0);  // kill(0, ...) would signal this test's own process group
  REQUIRE(kill(pid, SIGSTOP) == 0);
  Result r = get(host->evaluate(s, {{"x", 2}}));  // sits in the stopped worker's socket
  CHECK(r.status == Status::ok);                  // retried on the restarted worker
  CHECK(r.value == Value(2));
  const ShardStats st = host->shard_stats(0);
  CHECK(st.killed_silence == 1);
  CHECK(st.last_death.find("silent") != std::string::npos);
  CHECK(host->worker_pids()[0] != pid);
  CHECK(eventually([&] { return process_gone(pid); }));
}

TEST_CASE(
    "Supervision: a crash-looping worker makes its shard unavailable with a reason, then "
    "recovers") {
  TempDir dir;
  const auto marker = dir.path / "crash";
  const std::string wrapper = dir.script(
      "worker", "[ -e '" + marker.string() + "' ] && exit 3\nexec '" OUTRUN_TEST_WORKER "' \"$@\"");
  auto o = base_options();
  o.worker_path = wrapper;
  o.restart_delay = 5ms;
  o.crash_loop_limit = 3;
  o.crash_loop_window = 5000ms;
  o.crash_loop_cooldown = 500ms;
  auto host = start(o);
  Script s = reg(*host, "s", "return 1");
  CHECK(host->evaluate(s, {}).get().status == Status::ok);
  std::ofstream(marker) << "1";
  REQUIRE(!host->kill_shard(0));
  REQUIRE(eventually([&] { return host->shard_stats(0).state == "crash_loop"; }));
  Result r = host->evaluate(s, {}).get();
  CHECK(r.status == Status::unavailable);
  CHECK(r.error.find("crash loop") != std::string::npos);
  CHECK(r.error.find("code 3") != std::string::npos);
  std::filesystem::remove(marker);
  REQUIRE(eventually([&] { return host->shard_stats(0).state == "running"; }));
  CHECK(host->evaluate(s, {}).get().status == Status::ok);
  CHECK(host->shard_stats(0).exited >= 3);
}

TEST_CASE("Supervision: evaluations submitted while a shard restarts wait and then run") {
  auto o = base_options();
  o.restart_delay = 200ms;
  auto host = start(o);
  std::vector<Script> scripts;
  for (int i = 0; i < 20; ++i)
    scripts.push_back(reg(*host, "w" + std::to_string(i), "return inputs.x"));
  const int pid = host->worker_pids()[0];
  REQUIRE(!host->kill_shard(0));
  (void)pid;  // submitted at once: they land while the shard is down or just back
  Collector c(20);
  for (int i = 0; i < 20; ++i) host->evaluate(scripts[i], {{"x", i}}, c.at(i));
  REQUIRE(c.wait_all());
  for (int i = 0; i < 20; ++i) CHECK(c.results[i].value == Value(i));
}

TEST_CASE("Supervision: kill_shard and restart_shard lose nothing") {
  auto o = base_options();
  o.shards = 2;
  o.single_flight = SingleFlight::off;
  auto host = start(o);
  Script s =
      reg(*host, "k", "local t = os.clock() while os.clock() - t < 0.001 do end return inputs.x");
  constexpr int kN = 400;
  Collector c(kN);
  for (int i = 0; i < kN; ++i) {
    host->evaluate(s, {{"x", i}}, c.at(i));
    if (i == 100) REQUIRE(!host->kill_shard(static_cast<int>(s.shard())));
    if (i == 250) REQUIRE(!host->restart_shard(static_cast<int>(s.shard())));
  }
  REQUIRE(c.wait_all());
  for (int i = 0; i < kN; ++i) {
    CHECK(c.calls[i] == 1);
    CHECK(c.results[i].status == Status::ok);
  }
  CHECK(host->kill_shard(7).code == ErrorCode::invalid_argument);
}

TEST_CASE("Supervision: a caller that awaits and resubmits is never refused by itself") {
  auto host = start(base_options());  // single flight: refuse
  Script s = reg(*host, "tag", "return inputs.x");
  for (int i = 0; i < 10000; ++i) {
    Result r = host->evaluate(s, {{"x", i}}).get();
    REQUIRE(r.status == Status::ok);
  }
  // The same through callbacks: resubmit from inside the callback.
  std::mutex mu;
  std::condition_variable cv;
  int left = 2000, refused = 0;
  std::function<void(Result)> again = [&](Result r) {
    std::lock_guard lock(mu);
    if (r.status != Status::ok) ++refused;
    if (--left > 0)
      host->evaluate(s, {{"x", left}}, again);
    else
      cv.notify_all();
  };
  host->evaluate(s, {{"x", 0}}, again);
  std::unique_lock lock(mu);
  REQUIRE(cv.wait_for(lock, 60s, [&] { return left == 0; }));
  CHECK(refused == 0);
}

TEST_CASE(
    "Supervision: single flight refuses a second evaluation of a key, coalesce-latest replaces") {
  // Generous T: the point is the flight, not the clock (CPU-time loops stretch on a busy machine).
  {
    auto o = base_options();
    o.timeout = 5000ms;
    auto host = start(o);
    Script slow = reg(*host, "tag",
                      "local t = os.clock() while os.clock() - t < 0.05 do end return inputs.x");
    auto first = host->evaluate(slow, {{"x", 1}});
    Result second = host->evaluate(slow, {{"x", 2}}).get();
    CHECK(second.status == Status::busy);
    CHECK(second.error.find("'tag'") != std::string::npos);
    CHECK(first.get().value == Value(1));
    // Another key is not affected, and a new source under the same key shares the flight.
    Script other = reg(*host, "tag2", "return 2");
    CHECK(host->evaluate(other, {}).get().status == Status::ok);
  }
  {
    auto o = base_options();
    o.timeout = 5000ms;
    o.single_flight = SingleFlight::coalesce_latest;
    auto host = start(o);
    Script slow = reg(*host, "tag",
                      "local t = os.clock() while os.clock() - t < 0.05 do end return inputs.x");
    auto a = host->evaluate(slow, {{"x", 1}});
    auto b = host->evaluate(slow, {{"x", 2}});
    auto c = host->evaluate(slow, {{"x", 3}});
    CHECK(a.get().value == Value(1));
    Result rb = b.get();
    CHECK(rb.status == Status::busy);
    CHECK(rb.error.find("replaced") != std::string::npos);
    CHECK(c.get().value == Value(3));  // the latest runs after the one in flight
  }
}

TEST_CASE("Supervision: a callback that blocks for seconds delays only its own shard") {
  auto o = base_options();
  o.shards = 2;
  o.heartbeat_interval = 50ms;
  o.silence_limit = 500ms;
  auto host = start(o);
  auto [a, b] = scripts_on_shards_0_and_1(*host, "key", "return inputs.x");
  std::atomic<bool> sleeping_done{false};
  std::atomic<int> other_done_while_sleeping{0};
  host->evaluate(a, {{"x", 1}}, [&](Result) {
    std::this_thread::sleep_for(3s);
    sleeping_done = true;
  });
  std::this_thread::sleep_for(50ms);
  for (int i = 0; i < 50; ++i) {
    std::promise<void> p;
    host->evaluate(b, {{"x", i}}, [&](Result r) {
      if (r.status == Status::ok && !sleeping_done) ++other_done_while_sleeping;
      p.set_value();
    });
    p.get_future().wait();
  }
  CHECK(other_done_while_sleeping == 50);
  // Shard 0's reads, timers and heartbeats went on: its futures still complete meanwhile.
  CHECK(host->evaluate(a, {{"x", 5}}).get().value == Value(5));
  std::this_thread::sleep_for(1s);  // well past silence_limit while the callback still sleeps
  CHECK(host->shard_stats(0).deaths == 0);
  CHECK(host->shard_stats(1).deaths == 0);
}

TEST_CASE("Supervision: the group kill takes a worker's children with it") {
  TempDir dir;
  const auto pidfile = dir.path / "child.pid";
  const std::string wrapper =
      dir.script("worker", "sleep 1000 >/dev/null 2>&1 &\necho $! > '" + pidfile.string() +
                               "'\nexec '" OUTRUN_TEST_WORKER "' \"$@\"");
  auto o = base_options();
  o.worker_path = wrapper;
  o.bytecode_cache_bytes = 0;  // no compile-only process: the pidfile is the shard's worker's
  o.slow_lane = false;         // nor a slow lane's worker
  auto host = start(o);
  int child = 0;
  std::ifstream(pidfile) >> child;
  REQUIRE(child > 0);
  REQUIRE(!process_gone(child));
  Script stuck = reg(*host, "stuck", kStuckInC);
  CHECK(get(host->evaluate(stuck, {})).status == Status::killed);
  const bool gone = eventually([&] { return process_gone(child); }, 5s);
  CHECK(gone);
  if (!gone) kill(child, SIGKILL);
}

TEST_CASE("Supervision: killing the host with SIGKILL leaves no worker behind") {
  // The CLI is a host; its worker must die with it (PR_SET_PDEATHSIG).
  const pid_t cli = fork();
  if (cli == 0) {
    // Keep the test's output pipe out of the host and worker: an orphan must not hold it open.
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    setenv("OUTRUN_WORKER", OUTRUN_TEST_WORKER, 1);
    execl(OUTRUN_TEST_CLI, "outrun", "eval", "--timeout", "600000", "--grace", "600000", "-e",
          "while true do end", static_cast<char*>(nullptr));
    _exit(127);
  }
  int worker = 0;
  REQUIRE(eventually([&] {
    for (const auto& t :
         std::filesystem::directory_iterator("/proc/" + std::to_string(cli) + "/task")) {
      std::ifstream c(t.path() / "children");
      if (c >> worker) return true;
    }
    return false;
  }));
  REQUIRE(worker > 0);
  // Wait until the worker runs the script (not merely started): then only its parent's death
  // can end it, not the end of its pipe.
  REQUIRE(eventually([&] { return cpu_ticks(worker) >= 10; }));
  kill(cli, SIGKILL);
  waitpid(cli, nullptr, 0);
  const bool gone = eventually([&] { return process_gone(worker); }, 5s);
  CHECK(gone);
  if (!gone) kill(worker, SIGKILL);
}

TEST_CASE("Supervision: a worker that lost its scripts gets their sources again (NeedSource)") {
  FaultEnv fault("forget-scripts");
  auto host = start(test::with_test_faults(base_options()));
  std::vector<Script> scripts;
  for (int i = 0; i < 5; ++i)
    scripts.push_back(
        reg(*host, "ns" + std::to_string(i), "return inputs.x + " + std::to_string(i)));
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 5; ++i) {
      Result r = get(host->evaluate(scripts[i], {{"x", round}}));
      REQUIRE(r.status == Status::ok);
      CHECK(r.value == Value(round + i));
    }
  }
  CHECK(host->shard_stats(0).deaths == 0);
}

TEST_CASE("Supervision: a worker that asks for a source again and again is a protocol violation") {
  auto o = test::with_test_faults(base_options());
  o.retries = 0;
  std::unique_ptr<Host> host;
  {
    FaultEnv fault("need-source-loop");
    host = start(o);
  }
  Script s = reg(*host, "loop", "return 1");
  Result r = get(host->evaluate(s, {}));
  CHECK(r.status == Status::worker_lost);
  CHECK(r.error.find("asked twice for the source") != std::string::npos);
  CHECK(host->shard_stats(0).protocol_violations == 1);
  // Its successor (started without the fault) serves normally.
  CHECK(get(host->evaluate(s, {})).status == Status::ok);
}

TEST_CASE("Supervision: a worker that writes garbage is killed for it and nothing is lost") {
  // Every worker of this host has the fault, restarted ones too: an evaluation with the input
  // `garbage` makes its worker write that kind of garbage. With 40 ordinary evaluations in
  // flight around it, each ends exactly once, the ordinary ones ok with their values.
  struct Case {
    const char* kind;
    Status status;          // what the evaluation that caused it ends with
    const char* violation;  // in the shard's last_death
    uint64_t violations;    // protocol violations it costs
  };
  const Case cases[] = {
      {"bad-length", Status::worker_lost, "exceeds the maximum frame size", 1},
      {"bad-flatbuffer", Status::worker_lost, "failed verification", 1},
      {"bad-status", Status::worker_lost, "a status only the host may give", 1},
      // A status no build knows: the same violation (worker -> host, design/protocol.md).
      {"unknown-status", Status::worker_lost, "sent an unknown status (200)", 1},
      {"unknown-id", Status::worker_lost, "answered an evaluation it was not running", 1},
      // The first answer is delivered; the second is the violation.
      {"duplicate", Status::runtime_error, "answered an evaluation it was not running", 1},
      // A frame that verifies but would decode to 512 MiB, one string used 512 times.
      {"shared-string", Status::worker_lost, "sent results past the decode budget", 1},
      {"shared-keys", Status::worker_lost, "sent results past the decode budget", 1},
  };
  FaultEnv fault("garbage");
  auto o = test::with_test_faults(base_options());
  o.crash_loop_limit = 1000;  // five violations in a few seconds would be a crash loop
  // Each case ends by the violation, never by the deadline; T+G = 200 ms would let a slow read
  // of the 1 MiB shared-string frame (under TSan it copies 64 MiB before the budget refuses; it
  // took 13 s once on a loaded machine) turn the violation into a kill, and the kill moves
  // `bad` to the slow lane.
  o.grace = 60000ms;
  auto host = start(o);
  std::vector<Script> normal;
  for (int i = 0; i < 40; ++i)
    normal.push_back(reg(*host, "n" + std::to_string(i), "return inputs.x * 2"));
  Script bad = reg(*host, "bad", "return 1");
  for (const Case& c : cases) {
    CAPTURE(c.kind);
    const ShardStats before = host->shard_stats(0);
    Collector col(normal.size() + 1);
    for (std::size_t i = 0; i < normal.size(); ++i) {
      if (i == normal.size() / 2) host->evaluate(bad, {{"garbage", c.kind}}, col.at(normal.size()));
      host->evaluate(normal[i], {{"x", static_cast<int64_t>(i)}}, col.at(i));
    }
    REQUIRE(col.wait_all(30s));
    for (std::size_t i = 0; i <= normal.size(); ++i) CHECK(col.calls[i] == 1);
    for (std::size_t i = 0; i < normal.size(); ++i) {
      CHECK(col.results[i].status == Status::ok);
      CHECK(col.results[i].value == Value(static_cast<int64_t>(2 * i)));
    }
    const Result& r = col.results[normal.size()];
    CHECK(r.status == c.status);
    const ShardStats after = host->shard_stats(0);
    CHECK(after.protocol_violations - before.protocol_violations == c.violations);
    CHECK(after.last_death.find(c.violation) != std::string::npos);
    if (c.status == Status::worker_lost) CHECK(r.error.find(c.violation) != std::string::npos);
    // The shard serves again.
    CHECK(get(host->evaluate(normal[0], {{"x", 21}})).value == Value(42));
  }
}

TEST_CASE("Supervision: callbacks that submit and drill while the host is destroyed end cleanly") {
  auto o = base_options();
  o.shards = 2;
  o.single_flight = SingleFlight::off;
  std::atomic<int> outer{0}, inner{0};
  {
    auto host = start(o);
    // Not a structured binding: clang 14 cannot capture one.
    const auto [a_, b] = scripts_on_shards_0_and_1(*host, "d", "return 1");
    const Script a = a_;
    Host* h = host.get();
    for (int i = 0; i < 200; ++i) {
      h->evaluate(b, {}, [h, a, &outer, &inner](Result) {
        ++outer;
        // Done, or unavailable once ~Host began: either is right here.
        (void)h->kill_shard(0);
        (void)h->restart_shard(1);
        h->evaluate(a, {}, [&inner](Result) { ++inner; });
      });
    }
  }  // ~Host while callbacks still run and submit to the other shard
  CHECK(outer == 200);
  CHECK(inner == 200);  // every inner evaluation ended (ok, cancelled or retried), exactly once
}
