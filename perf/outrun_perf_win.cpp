// outrun-perf on Windows (outrun-perf.exe, cross-built and run under Wine in CI): the rows of
// outrun-perf that make sense without /proc, Redis, outrund or the profilers, measured the same way
// and under the same row ids, so that they can be set beside the Linux figures
// (design/budgets.md "Windows, under Wine"):
//   host.idle_p50_us, host.idle_p99_us            sequential round trips through futures
//   host.idle_sync_p50_us, host.idle_sync_p99_us  the same through evaluate_sync
//   inprocess.idle_p50_us, inprocess.idle_p99_us  the same script in this process
//   kill.after_tg_p50_ms, kill.after_tg_max_ms    a runaway stuck in one C call: its result's
//                                                 arrival after T+G (TerminateJobObject's kill);
//   kill.after_tg_min_ms                          (Windows only) the fastest round
//   kill.shard_next_ok_p50_ms, ..._max_ms         kill_shard -> a new worker's next ok
// Every result is checked; `all.wrong` counts the wrong ones (exit 1 when any).
//
//   outrun-perf [--iterations N] [--kill-rounds N] [--timeout MS] [--grace MS] [--json FILE]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "latency_histogram.h"
#include "outrun/host.h"
#include "outrun/in_process.h"

using namespace outrun;

namespace {

const char* kScript = "return (inputs.a + inputs.b) / 2";  // as outrun-perf's
const char* kStuck = "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')";

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Inputs inputs_for(int64_t i) {
  return {{"a", i}, {"b", i + 2}};
}

bool check(const Result& r, int64_t i) {
  return r.status == Status::ok && r.value == Value(static_cast<double>(i + 1));
}

// Waits (up to 10 s) for `pred` on the host's shard stats.
template <class Pred>
bool wait_for(Pred pred) {
  const int64_t deadline = now_ns() + 10'000'000'000;
  while (!pred()) {
    if (now_ns() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

struct Run {
  std::map<std::string, double> rows;
  int64_t checked = 0, wrong = 0;
};

double us(int64_t ns) {
  return static_cast<double>(ns) / 1e3;
}
double ms(int64_t ns) {
  return static_cast<double>(ns) / 1e6;
}

// Sequential round trips: 200 warm-up, then `n` measured.
void idle(Runner& r, const Script& s, int n, bool sync, const std::string& prefix, Run* run) {
  LatencyHistogram h;
  for (int i = 0; i < n + 200; ++i) {
    const int64_t t0 = now_ns();
    Result res = sync ? r.evaluate_sync(s, inputs_for(i)) : r.evaluate(s, inputs_for(i)).get();
    const int64_t dt = now_ns() - t0;
    ++run->checked;
    run->wrong += !check(res, i);
    if (i >= 200) h.record(dt);
  }
  run->rows[prefix + "_p50_us"] = us(h.quantile(0.5));
  run->rows[prefix + "_p99_us"] = us(h.quantile(0.99));
}

bool kill_rows(HostOptions ho, int rounds, Run* run) {
  std::unique_ptr<Host> host;
  if (Error e = Host::create(ho, &host)) {
    std::fprintf(stderr, "outrun-perf: cannot start the host: %s\n", e.message.c_str());
    return false;
  }
  Script stuck, ok;
  if (host->register_script("perf.stuck", kStuck, &stuck) ||
      host->register_script("perf.ok", kScript, &ok))
    return false;
  const int64_t tg = (ho.timeout + ho.grace).count() * 1'000'000;
  LatencyHistogram after_tg, shard_kill;
  for (int i = 0; i < rounds; ++i) {
    run->wrong += !check(host->evaluate(ok, inputs_for(i)).get(), i);
    const int shard = static_cast<int>(host->shard_of(stuck));
    run->wrong += !wait_for([&] { return host->shard_stats(shard).state == "running"; });
    const int64_t t0 = now_ns();
    const Result r = host->evaluate(stuck, {}).get();
    after_tg.record(now_ns() - t0 - tg);
    run->checked += 2;
    run->wrong += r.status != Status::killed;
  }
  const int shard = static_cast<int>(ok.shard());
  for (int i = 0; i < rounds; ++i) {
    run->wrong += !check(host->evaluate(ok, inputs_for(i)).get(), i);
    const uint64_t starts = host->shard_stats(shard).starts;
    const int64_t t0 = now_ns();
    run->wrong += static_cast<bool>(host->kill_shard(shard));
    run->wrong += !wait_for([&] { return host->shard_stats(shard).starts != starts; });
    run->wrong += !check(host->evaluate(ok, inputs_for(i)).get(), i);
    shard_kill.record(now_ns() - t0);
    run->checked += 2;
  }
  run->rows["kill.after_tg_p50_ms"] = ms(after_tg.quantile(0.5));
  run->rows["kill.after_tg_max_ms"] = ms(after_tg.max());
  // Not a Linux row: the first rounds kill a worker that has run before; the later ones, the slow
  // lane's worker started by the previous round's kill, whose first evaluation under Wine is
  // ~16 ms slower (design/windows.md).
  run->rows["kill.after_tg_min_ms"] = ms(after_tg.quantile(0));
  run->rows["kill.shard_next_ok_p50_ms"] = ms(shard_kill.quantile(0.5));
  run->rows["kill.shard_next_ok_max_ms"] = ms(shard_kill.max());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outrun-perf (Windows): idle round trip and kill latency, as on Linux"};
  int iterations = 2000, kill_rounds = 10, timeout_ms = 50, grace_ms = 50;
  std::string json_path;
  app.add_option("--iterations", iterations, "measured idle round trips")->capture_default_str();
  app.add_option("--kill-rounds", kill_rounds, "runaways killed")->capture_default_str();
  app.add_option("--timeout", timeout_ms, "T for the kill rows, ms")->capture_default_str();
  app.add_option("--grace", grace_ms, "G for the kill rows, ms")->capture_default_str();
  app.add_option("--json", json_path, "write the rows to this file");
  CLI11_PARSE(app, argc, argv);

  Run run;
  HostOptions ho;  // the defaults: 2 shards, as outrun-perf's main arm
  {
    std::unique_ptr<Host> host;
    if (Error e = Host::create(ho, &host)) {
      std::fprintf(stderr, "outrun-perf: cannot start the host: %s\n", e.message.c_str());
      return 2;
    }
    Script s;
    if (host->register_script("perf.idle", kScript, &s)) return 2;
    idle(*host, s, iterations, false, "host.idle", &run);
    idle(*host, s, iterations, true, "host.idle_sync", &run);
  }
  {
    InProcess in;
    Script s;
    if (in.register_script("perf.idle", kScript, &s)) return 2;
    idle(in, s, iterations, false, "inprocess.idle", &run);
  }
  HostOptions kill = ho;
  kill.timeout = std::chrono::milliseconds(timeout_ms);
  kill.grace = std::chrono::milliseconds(grace_ms);
  if (!kill_rows(kill, kill_rounds, &run)) return 2;
  run.rows["all.checked"] = static_cast<double>(run.checked);
  run.rows["all.wrong"] = static_cast<double>(run.wrong);

  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : run.rows) {
    std::printf("%-28s %10.3f\n", k.c_str(), v);
    j[k] = v;
  }
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  return run.wrong == 0 ? 0 : 1;
}
