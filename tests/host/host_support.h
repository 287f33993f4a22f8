// Helpers shared by the host's end-to-end tests.
#pragma once

#include <doctest/doctest.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "outrun/host.h"

namespace outrun::test {

inline std::unique_ptr<Host> start_host(const HostOptions& o) {
  std::unique_ptr<Host> host;
  Error err = Host::create(o, &host);
  REQUIRE_MESSAGE(!err, err.message);
  return host;
}

inline Script reg(Runner& r, const std::string& key, const std::string& src) {
  Script s;
  Error err = r.register_script(key, src, &s);
  REQUIRE_MESSAGE(!err, err.message);
  return s;
}

// Registers `prefix0`, `prefix1`, ... until one script lands on shard 0 and one on shard 1.
inline std::pair<Script, Script> scripts_on_shards_0_and_1(Runner& r, const std::string& prefix,
                                                           const std::string& src) {
  Script a, b;
  for (int i = 0; !a.valid() || !b.valid(); ++i) {
    Script s = reg(r, prefix + std::to_string(i), src);
    if (s.shard() == 0 && !a.valid()) a = s;
    if (s.shard() == 1 && !b.valid()) b = s;
  }
  return {a, b};
}

// Sets OUTRUN_TEST_FAULT for workers started while it lives (they inherit the environment).
// Only outrun-test-worker reads it (tests/worker_faults/): a test that sets it runs that worker,
// with_test_faults() below; the shipped outrun-worker ignores it.
struct FaultEnv {
  explicit FaultEnv(const char* fault) { setenv("OUTRUN_TEST_FAULT", fault, 1); }
  ~FaultEnv() { unsetenv("OUTRUN_TEST_FAULT"); }
  FaultEnv(const FaultEnv&) = delete;
  FaultEnv& operator=(const FaultEnv&) = delete;
};

// `o` with the worker that has the test faults (outrun-test-worker, next to outrun-worker).
inline HostOptions with_test_faults(HostOptions o) {
  o.worker_path = OUTRUN_TEST_FAULT_WORKER;
  return o;
}

// Polls `cond` every 5 ms until it holds or `limit` passed; its last value.
inline bool eventually(const std::function<bool()>& cond,
                       std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

// True when `pid` no longer runs (gone, or a zombie).
inline bool process_gone(int pid) {
  REQUIRE(pid > 0);  // kill(0, ...) would ask about this test's own process group
  if (kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto p = line.rfind(')');
  return p != std::string::npos && p + 2 < line.size() && line[p + 2] == 'Z';
}

// Collects one result per index and counts how often each index was answered.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> calls;
  std::vector<Result> results;
  std::size_t done = 0;
  explicit Collector(std::size_t n) : calls(n, 0), results(n) {}
  void record(std::size_t i, Result r) {
    std::lock_guard lock(mu);
    ++calls[i];
    results[i] = std::move(r);
    ++done;
    cv.notify_all();
  }
  Callback at(std::size_t i) {
    return [this, i](Result r) { record(i, std::move(r)); };
  }
  bool wait(std::size_t n, std::chrono::milliseconds limit = std::chrono::seconds(60)) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return done >= n; });
  }
  bool wait_all(std::chrono::milliseconds limit = std::chrono::seconds(60)) {
    return wait(calls.size(), limit);
  }
};

}  // namespace outrun::test
