// Helpers shared by the host's end-to-end tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include <doctest/doctest.h>

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
  bool wait_all(std::chrono::milliseconds limit = std::chrono::seconds(60)) { return wait(calls.size(), limit); }
};

}  // namespace outrun::test
