// The runaway drill: see runaway_drill.h.
#include "runaway_drill.h"

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "measure.h"

namespace outrun::perf {
namespace {

struct DrillFig {
  bool started = false;
  uint64_t sent = 0, ok = 0, wrong = 0;
  int64_t p50_us = 0, p99_us = 0, max_us = 0;
  double ok_per_s = 0;
  uint64_t runaway_ends = 0, lane_evaluations = 0, moves_in = 0;
};

DrillFig run_arm(const RunawayDrillParams& p, HostOptions ho) {
  DrillFig fig;
  // Nothing is refused `busy`: a neighbour evaluation queued behind the runaway waits and counts.
  ho.single_flight = SingleFlight::off;
  std::unique_ptr<Host> host;
  if (Error e = Host::create(ho, &host)) {
    std::fprintf(stderr, "outrun-perf: --runaway-drill: %s\n", e.message.c_str());
    return fig;
  }
  fig.started = true;
  Script runaway, honest;
  const char* spin = p.runaway_kind == 0
                         ? "while true do end"
                         : "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')";
  if (host->register_script("drill.runaway", spin, &runaway)) return fig;
  // A neighbour on the runaway's home shard.
  for (int i = 0; !honest.valid() || honest.shard() != runaway.shard(); ++i)
    if (host->register_script("drill.honest" + std::to_string(i), "return inputs.x + 1", &honest))
      return fig;
  (void)host->evaluate_sync(honest, {{"x", 0}});  // compiled and warm
  LatencyHistogram hist;
  std::atomic<uint64_t> ok{0}, wrong{0}, ended{0}, runaway_ends{0};
  std::atomic<bool> stop{false};
  // The runaway: submitted again from its own callback, as soon as each evaluation ends.
  std::function<void(Result)> again = [&](Result) {
    runaway_ends.fetch_add(1, std::memory_order_relaxed);
    if (!stop.load()) host->evaluate(runaway, {}, again);
  };
  host->evaluate(runaway, {}, again);
  const int64_t period = static_cast<int64_t>(1e9 / p.rate);
  const int64_t t0 = mono_ns();
  const int64_t end = t0 + static_cast<int64_t>(p.seconds * 1e9);
  uint64_t sent = 0;
  for (int64_t next = t0; next < end; next += period) {
    sleep_until_ns(next);
    const int64_t x = static_cast<int64_t>(sent++);
    const int64_t at = mono_ns();
    host->evaluate(honest, {{"x", x}}, [&, x, at](Result r) {
      hist.record((mono_ns() - at) / 1000);
      if (r.status == Status::ok && r.value == Value(x + 1))
        ok.fetch_add(1, std::memory_order_relaxed);
      else
        wrong.fetch_add(1, std::memory_order_relaxed);
      ended.fetch_add(1, std::memory_order_relaxed);
    });
  }
  while (ended.load() < sent) sleep_ns(1'000'000);
  const double elapsed = static_cast<double>(mono_ns() - t0) / 1e9;
  stop.store(true);
  const SlowLaneStats lane = host->slow_lane_stats();
  fig.lane_evaluations = lane.evaluations;
  fig.moves_in = lane.moves_in;
  host.reset();  // the runaway's last evaluation ends (cancelled) before `again` goes
  fig.sent = sent;
  fig.ok = ok.load();
  fig.wrong = wrong.load();
  fig.runaway_ends = runaway_ends.load();
  fig.p50_us = hist.quantile(0.5);
  fig.p99_us = hist.quantile(0.99);
  fig.max_us = hist.max();
  fig.ok_per_s = static_cast<double>(fig.ok) / elapsed;
  return fig;
}

}  // namespace

int runaway_drill(const RunawayDrillParams& p, const HostOptions& base) {
  std::printf(
      "runaway drill: %d shard(s), T=%lld ms, G=%lld ms, runaway %s, neighbour %.0f/s, "
      "%.1f s per arm\n",
      base.shards, static_cast<long long>(base.timeout.count()),
      static_cast<long long>(base.grace.count()),
      p.runaway_kind == 0 ? "`while true do end` (timeout at T)"
                          : "stuck in a C call (killed at T+G)",
      p.rate, p.seconds);
  std::printf("%-14s %10s %10s %10s %12s %10s %10s %14s\n", "arm", "p50_us", "p99_us", "max_us",
              "neighbour/s", "sent", "wrong", "runaway_ends");
  int rc = 0;
  for (const bool lane : {false, true}) {
    HostOptions ho = base;
    ho.slow_lane = lane;
    const DrillFig f = run_arm(p, ho);
    if (!f.started) return 1;
    std::printf("%-14s %10lld %10lld %10lld %12.0f %10llu %10llu %14llu\n",
                lane ? "slow_lane=on" : "slow_lane=off", static_cast<long long>(f.p50_us),
                static_cast<long long>(f.p99_us), static_cast<long long>(f.max_us), f.ok_per_s,
                static_cast<unsigned long long>(f.sent), static_cast<unsigned long long>(f.wrong),
                static_cast<unsigned long long>(f.runaway_ends));
    if (lane)
      std::printf("  lane: %llu move(s) in, %llu runaway evaluations served there\n",
                  static_cast<unsigned long long>(f.moves_in),
                  static_cast<unsigned long long>(f.lane_evaluations));
    if (f.wrong > 0 || f.ok + f.wrong != f.sent) rc = 1;
  }
  return rc;
}

}  // namespace outrun::perf
