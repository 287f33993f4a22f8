// outrun::Host on Windows, under Wine in CI: its workers in Job Objects over named pipes, read on
// the loop (libuv's IOCP), a soft timeout, the kill at T+G of a worker stuck in one C call, and
// many evaluations in flight through the non-blocking frame pipe (design/windows.md "The Host on
// Windows"). Through the public interface only.
#include "outrun/host.h"

#include <doctest/doctest.h>
#include <windows.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "windows/worker_session.h"

using namespace outrun;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<Host> start(HostOptions o, const char* worker = "outrun-worker.exe") {
  o.worker_path = wintest::beside_me(worker);
  std::unique_ptr<Host> host;
  const Error e = Host::create(o, &host);
  INFO(e.message);
  REQUIRE(!e);
  return host;
}

Script reg(Host& h, const std::string& key, const std::string& source) {
  Script s;
  const Error e = h.register_script(key, source, &s);
  INFO(e.message);
  REQUIRE(!e);
  return s;
}

// The worker `pid`'s process, for this test to see it end (SYNCHRONIZE only).
HANDLE open_worker(int pid) {
  return OpenProcess(SYNCHRONIZE, FALSE, static_cast<DWORD>(pid));
}

}  // namespace

TEST_CASE("a Host on Windows answers return 1 + 1 with 2, synchronously and through futures") {
  HostOptions o;
  o.shards = 2;
  auto host = start(o);
  Script s = reg(*host, "sum", "return 1 + 1");
  const auto t0 = Clock::now();
  Result r = host->evaluate_sync(s, {});
  INFO(r.error);
  REQUIRE(r.status == Status::ok);
  CHECK(r.value == Value(2));
  std::printf("Host on Windows: first result %.1f ms after the host started\n",
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  // 20 scripts (one evaluation of a key in flight at a time), 10 rounds, over both shards.
  std::vector<Script> adds;
  for (int k = 0; k < 20; ++k)
    adds.push_back(reg(*host, "add" + std::to_string(k), "return inputs.a + inputs.b"));
  for (int round = 0; round < 10; ++round) {
    std::vector<Future> fs;
    for (int k = 0; k < 20; ++k)
      fs.push_back(host->evaluate(adds[static_cast<std::size_t>(k)], {{"a", k}, {"b", round}}));
    for (int k = 0; k < 20; ++k) {
      Result x = fs[static_cast<std::size_t>(k)].get();
      INFO(to_string(x.status), ": ", x.error);
      REQUIRE(x.status == Status::ok);
      CHECK(x.value == Value(k + round));
    }
  }
}

TEST_CASE("a Host on Windows ends while true do end at its soft timeout, the worker kept") {
  HostOptions o;
  o.shards = 1;
  o.timeout = 50ms;
  o.grace = 2000ms;
  auto host = start(o);
  Script spin = reg(*host, "spin", "while true do end");
  const int pid = host->shard_stats(0).pid;
  REQUIRE(pid > 0);
  Result r = host->evaluate_sync(spin, {});
  CHECK(r.status == Status::timeout);
  // The instruction hook ended it: the same worker answers the next one.
  Script one = reg(*host, "one", "return 1");
  CHECK(host->evaluate_sync(one, {}).value == Value(1));
  CHECK(host->shard_stats(0).pid == pid);
  CHECK(host->shard_stats(0).deaths == 0);
}

TEST_CASE("a Host on Windows kills a worker stuck in one C call at T+G, with its Job Object") {
  HostOptions o;
  o.shards = 1;
  o.timeout = 50ms;
  o.grace = 100ms;
  auto host = start(o);
  const int pid = host->shard_stats(0).pid;
  REQUIRE(pid > 0);
  HANDLE worker = open_worker(pid);
  REQUIRE(worker != nullptr);
  // Pattern backtracking inside string.find: no instruction hook runs, only the kill ends it.
  Script stuck = reg(*host, "stuck", R"(return (("a"):rep(200000)):find(".-.-.-.-.-.-.-.-b"))");
  const auto t0 = Clock::now();
  Result r = host->evaluate_sync(stuck, {});
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  CHECK(r.status == Status::killed);
  // The worker is gone (its process handle signalled), not merely forgotten.
  CHECK(WaitForSingleObject(worker, 10'000) == WAIT_OBJECT_0);
  DWORD code = 0;
  GetExitCodeProcess(worker, &code);
  CloseHandle(worker);
  std::printf(
      "Host on Windows: stuck evaluation ended %s after %.1f ms (T+G = 150 ms), exit 0x%lx\n",
      std::string(to_string(r.status)).c_str(), ms, static_cast<unsigned long>(code));
  // A new worker took its place and answers.
  Script one = reg(*host, "one", "return 1");
  Result next = host->evaluate_sync(one, {});
  CHECK(next.status == Status::ok);
  const ShardStats st = host->shard_stats(0);
  CHECK(st.killed_overrun == 1);
  CHECK(st.pid != pid);
  CHECK(st.pid > 0);
}

TEST_CASE("a Host on Windows writes large frames through the non-blocking pipe whole") {
  HostOptions o;
  o.shards = 1;
  o.timeout = 5000ms;  // the busy one below runs 300 ms
  auto host = start(o);
  // Inputs of 200 KB each, 20 in flight: more than the frame pipe's 256 KB buffer at once, so
  // writes are handed to the loop and finished as the worker drains the pipe.
  std::vector<Script> lens;
  for (int k = 0; k < 20; ++k)
    lens.push_back(reg(*host, "len" + std::to_string(k), "return #inputs.s"));
  const std::string big(200'000, 'x');
  // The worker busy first (it reads nothing for 300 ms): the pipe fills, and the rest waits as one
  // backlog the loop writes as the worker drains it.
  Script busy =
      reg(*host, "busy", "local t = os.clock() while os.clock() - t < 0.3 do end return 1");
  Future first = host->evaluate(busy, {});
  std::vector<Future> fs;
  for (int i = 0; i < 20; ++i)
    fs.push_back(
        host->evaluate(lens[static_cast<std::size_t>(i)], {{"s", big + std::to_string(i)}}));
  for (int i = 0; i < 20; ++i) {
    Result r = fs[static_cast<std::size_t>(i)].get();
    INFO(to_string(r.status), ": ", r.error);
    REQUIRE(r.status == Status::ok);
    CHECK(r.value == Value(static_cast<int64_t>(big.size() + std::to_string(i).size())));
  }
  CHECK(first.get().status == Status::ok);
}

TEST_CASE("a Host on Windows whose worker executable is missing says so") {
  HostOptions o;
  o.worker_path = wintest::beside_me("no-such-worker.exe");
  std::unique_ptr<Host> host;
  const Error e = Host::create(o, &host);
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK(e.message.find("no-such-worker.exe") != std::string::npos);
}

TEST_CASE(
    "a Host on Windows charges an access violation to the script that ran and quarantines it") {
  // Every worker of this host (outrun-test-worker.exe, which inherits the variable) faults when it
  // is sent a source or bytecode that contains the marker.
  REQUIRE(SetEnvironmentVariableA("OUTRUN_TEST_FAULT", "crash-on-source=CRASH-ME"));
  struct Unset {
    ~Unset() { SetEnvironmentVariableA("OUTRUN_TEST_FAULT", nullptr); }
  } unset;
  HostOptions o;
  o.shards = 1;
  o.restart_delay = 5ms;
  o.crash_loop_limit = 3;  // fewer than the crashes below, were they the shard's
  o.slow_lane = false;
  o.timeout = 5000ms;  // crashes, not kills
  o.grace = 5000ms;
  auto host = start(o, "outrun-test-worker.exe");
  Script bad = reg(*host, "bad", "return 'CRASH-ME'");
  Script good = reg(*host, "good", "return inputs.x + 1");
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    const Result b = host->evaluate(bad, {}).get();
    if (i < 2) {
      // The crash's suspect, not retried; its death read from the NTSTATUS.
      CHECK_MESSAGE(b.status == Status::worker_lost, b.error);
      CHECK(b.error.find("access violation") != std::string::npos);
      CHECK(b.killed_worker);
    } else {
      CHECK_MESSAGE(b.status == Status::runtime_error, b.error);
      CHECK(b.error.find("script 'bad' is quarantined: it crashed its worker 2 times (last: "
                         "crashed: access violation (STATUS_ACCESS_VIOLATION") !=
            std::string::npos);
    }
    const Result g = host->evaluate(good, {{"x", i}}).get();
    CHECK_MESSAGE(g.status == Status::ok, g.error);
    CHECK(g.value == Value(i + 1));
  }
  const ShardStats st = host->shard_stats(0);
  CHECK(st.deaths == 2);
  CHECK(st.crashes_charged == 2);
  CHECK(st.state == "running");
  CHECK(st.last_death.find("STATUS_ACCESS_VIOLATION") != std::string::npos);
  CHECK(host->script_crashes(bad).quarantined);
  CHECK(host->script_crashes(good).crashes == 0);
}
