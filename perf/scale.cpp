#include "scale.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>

#include "harness.h"
#include "measure.h"

namespace outrun::perf {

namespace {

// Idle script states the workers closed for their budget and chunks they compiled, summed over
// every shard (the current workers' status pages: a restarted worker starts again from 0).
struct WorkerCounts {
  uint64_t evictions = 0, compiles = 0;
};
WorkerCounts worker_counts(const Host& h) {
  WorkerCounts c;
  for (int i = 0; i < h.shards(); ++i) {
    const ShardStats st = h.shard_stats(i);
    c.evictions += st.worker_evictions;
    c.compiles += st.worker_compiles;
  }
  return c;
}

double total_rss_mb(const std::vector<int>& pids) {
  long kb = 0;
  for (int pid : pids) kb += pid > 0 ? rss_kb(pid) : 0L;
  return static_cast<double>(kb) / 1024.0;
}

// The six steps for one N, on a fresh host. Returns false when the host did not start; a script
// that did not register ends the steps for this N (counted wrong).
bool scale_one(int n, const ScaleParams& p, const HostOptions& ho, Figs& f,
               const std::function<void(double, double)>& count) {
  std::fprintf(stderr, "outrun-perf: scale: %d scripts\n", n);
  std::unique_ptr<Host> host;
  if (Error err = Host::create(ho, &host)) {
    std::fprintf(stderr, "outrun-perf: scale: cannot start the host: %s\n", err.message.c_str());
    return false;
  }
  const std::string pre = "scale." + std::to_string(n) + ".";
  const auto size = static_cast<std::size_t>(n);
  // Generous: a cold run of 100,000 scripts takes seconds, not minutes, even on a busy machine.
  const auto limit = std::chrono::seconds(60 + n / 1000);
  int64_t checked = 0, wrong = 0;

  // 1. Registration of N scripts, spread over the shards by the hash of their keys.
  std::vector<Script> all(size);
  int64_t t0 = mono_ns();
  const int64_t t_registered = t0;
  for (int i = 0; i < n; ++i)
    if (!setup_ok(host->register_script("scale." + std::to_string(i), tag_source(i),
                                        &all[static_cast<std::size_t>(i)]),
                  "scale: register scale." + std::to_string(i))) {
      count(static_cast<double>(n - i), static_cast<double>(n - i));
      return true;
    }
  f[pre + "register_ms"] = ms(mono_ns() - t0);
  auto expect_all = [](int64_t round) {
    return [round](std::size_t k) { return Value(tag_value(static_cast<int>(k), round, 0)); };
  };

  // 2. Cold: every script's first evaluation (sent with its source, compiled).
  t0 = mono_ns();
  wrong += run_all(*host, all, 1, expect_all(1), limit);
  f[pre + "cold_ms"] = ms(mono_ns() - t0);
  checked += n;

  // The compile-only process's bytecode for all N (design/sandbox.md "The compiler"): made
  // while the registrations and the cold run went on; waited for here, so the windows below
  // measure a host whose scripts are all registered, as a running server's are.
  const int64_t compile_deadline = mono_ns() + static_cast<int64_t>(limit.count()) * 1'000'000'000;
  while (!host->compiler_stats().idle && mono_ns() < compile_deadline) sleep_ns(1'000'000);
  {
    const CompilerStats cs = host->compiler_stats();
    f[pre + "compile_ahead_ms"] = ms(mono_ns() - t_registered);
    f[pre + "bytecode_mb"] = static_cast<double>(cs.cached_bytes) / (1024.0 * 1024.0);
    f[pre + "bytecode_count"] = static_cast<double>(cs.compiled);
    f[pre + "compiler_rss_mb"] = cs.pid > 0 ? static_cast<double>(rss_kb(cs.pid)) / 1024.0 : 0.0;
  }

  // 3. What the workers hold with N scripts registered and run once.
  const std::vector<int> pids = host->worker_pids();
  f[pre + "rss_total_mb"] = total_rss_mb(pids);
  f[pre + "rss_max_mb"] = max_rss_mb(pids);
  const WorkerCounts cold = worker_counts(*host);
  f[pre + "evictions_count"] = static_cast<double>(cold.evictions);
  f[pre + "compiles_count"] = static_cast<double>(cold.compiles);

  // 4. Paced load spread over all N: send i evaluates script perm[i % N], a fixed shuffle, so
  // every pass visits each script once, consecutive sends go to unrelated scripts (and shards),
  // and the order is not the cold run's.
  std::vector<std::size_t> perm(size);
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(20261201));
  WorkerCounts at_start, at_stop;
  WindowHooks hooks{[&] { at_start = worker_counts(*host); },
                    [&] { at_stop = worker_counts(*host); }};
  const PacedFig pf = paced_load(
      *host, all, p.rate, p.warmup_s, p.duration_s, pids, hooks,
      [&perm, size](int64_t i) { return perm[static_cast<std::size_t>(i) % size]; },
      [&perm, size](const Result& r, int64_t i) {
        const std::size_t k = perm[static_cast<std::size_t>(i) % size];
        const int64_t a = input_a(i);
        if (r.status == Status::ok && r.value == Value(tag_value(static_cast<int>(k), a, a + 1)))
          return true;
        if (first_wrong_report())
          std::fprintf(stderr, "outrun-perf: scale: wrong result of scale.%zu: %s %s\n", k,
                       std::string(to_string(r.status)).c_str(), r.error.c_str());
        return false;
      });
  f[pre + "paced_p50_us"] = pf.lat.p50_us;
  f[pre + "paced_p99_us"] = pf.lat.p99_us;
  f[pre + "paced_p999_us"] = pf.lat.p999_us;
  f[pre + "paced_workers_us_per_eval"] = pf.other_us_per_msg;
  f[pre + "paced_evictions_count"] = static_cast<double>(at_stop.evictions - at_start.evictions);
  f[pre + "paced_compiles_count"] = static_cast<double>(at_stop.compiles - at_start.compiles);
  count(static_cast<double>(pf.measured), static_cast<double>(pf.wrong));

  // 5. Warm restart: shard 0 killed -> every one of its scripts' next ok.
  std::vector<Script> on0;
  std::vector<std::size_t> on0_index;
  for (std::size_t k = 0; k < size; ++k)
    if (all[k].shard() == 0) {
      on0.push_back(all[k]);
      on0_index.push_back(k);
    }
  uint64_t starts = host->shard_stats(0).starts;
  t0 = mono_ns();
  wrong += !setup_ok(host->kill_shard(0), "scale: kill_shard");
  wrong += !wait_restarted(*host, 0, starts);
  wrong += run_all(
      *host, on0, 2,
      [&on0_index](std::size_t k) {
        return Value(tag_value(static_cast<int>(on0_index[k]), 2, 0));
      },
      limit);
  f[pre + "warm_restart_ms"] = ms(mono_ns() - t0);
  f[pre + "warm_restart_count"] = static_cast<double>(on0.size());
  f[pre + "warm_restart_compiles_count"] =
      static_cast<double>(host->shard_stats(0).worker_compiles);
  checked += static_cast<int64_t>(on0.size());

  // 6. Kill every shard at once -> every one of the N scripts' next result.
  std::vector<uint64_t> before;
  for (int i = 0; i < host->shards(); ++i) before.push_back(host->shard_stats(i).starts);
  t0 = mono_ns();
  for (int i = 0; i < host->shards(); ++i)
    wrong += !setup_ok(host->kill_shard(i), "scale: kill_shard");
  for (int i = 0; i < host->shards(); ++i)
    wrong += !wait_restarted(*host, i, before[static_cast<std::size_t>(i)]);
  wrong += run_all(*host, all, 3, expect_all(3), limit);
  f[pre + "kill_all_ms"] = ms(mono_ns() - t0);
  const WorkerCounts after = worker_counts(*host);
  f[pre + "kill_all_compiles_count"] = static_cast<double>(after.compiles);
  f[pre + "kill_all_evictions_count"] = static_cast<double>(after.evictions);
  checked += n;

  // 7. The workers after all that (new processes since step 6).
  f[pre + "rss_total_after_mb"] = total_rss_mb(host->worker_pids());
  count(static_cast<double>(checked), static_cast<double>(wrong));
  return true;
}

}  // namespace

bool scale_section(const ScaleParams& p, const HostOptions& ho, Figs& f,
                   const std::function<void(double, double)>& count) {
  bool ok = true;
  for (int n : p.sizes) ok &= scale_one(n, p, ho, f, count);
  return ok;
}

}  // namespace outrun::perf
