// outrun-perf: every budget row of BRIEF §5 in one run, beside InProcess, the floors of this
// machine and Redis, each measured in the same run. See design/budgets.md for how to run it and
// how to read its output and profiles.
//
// What is measured, in each repeat: the floors (pipe round trip; pacing alone; the bare shape with
// and without a dispatcher hop, at the paced rate), Redis (single client, paced, pipelined),
// InProcess (idle, paced, closed loop), then per arm (HostOptions; two with --ab) the host:
// idle latency and CPU, paced open loop, closed loop, supervision (kill after T+G, kill a shard),
// and scripts (RSS with N compiled scripts, warm restart of one shard, kill every shard); and
// outrund as a server beside redis-server (daemon_peer.h: single client, pipelined, server CPU).
// Asked for by name only (--rows scale): 10,000 and 100,000 scripts over every shard (scale.h).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "daemon_peer.h"
#include "floors.h"
#include "harness.h"
#include "latency_histogram.h"
#include "measure.h"
#include "outrun/client.h"
#include "outrun/host.h"
#include "outrun/in_process.h"
#include "profiler.h"
#include "redis_peer.h"
#include "report.h"
#include "runaway_drill.h"
#include "scale.h"
#include "tags_perf.h"

namespace fs = std::filesystem;

namespace outrun::perf {
namespace {

const char* kScript = "return (inputs.a + inputs.b) / 2";

// ---------------------------------------------------------------- options

struct Options {
  std::string tags_state_dir;  // tags: also measure the state store here (empty: not)
  int shards = 2;
  double rate = 10000;
  double duration = 5.0;  // seconds per paced window
  double warmup = 0.5;    // seconds of paced load before each window
  double closed_duration = 3.0;
  int iterations = 5000;  // round trips per idle-latency row
  int scripts = 1000;
  std::vector<int> scale = {10000, 100000};  // N of the scale section: scripts over every shard
  int timeout_ms = 50, grace_ms = 50;
  int kill_rounds = 20;
  double idle_seconds = 2.0;
  int keys = 64;  // scripts the paced and closed-loop loads spread over (both shards)
  int redis_clients = 16, redis_depth = 16;
  std::string redis_binary = "redis-server";
  std::string outrund_binary;  // empty: bin/outrund next to outrun-perf; "none": no daemon rows
  std::string daemon_inputs = "nested";  // how the raw-frames client sends inputs (daemon_peer.h)
  int repeat = 1;
  bool quick = false, smoke = false, verbose = false;
  std::set<std::string> sections;
  std::string ab;
  std::string out_dir = "perf-out", json_path, markdown_path;
  std::string profile_dir;
  std::vector<std::string> profile_rows = {"paced", "closed"};
  bool profile = false;
  double profile_seconds = 8;
  bool runaway_drill = false;  // --runaway-drill: only that (runaway_drill.h)
  RunawayDrillParams drill;
};

// What `all` measures; `scale` (minutes at 100,000 scripts) only when asked for by name.
const std::vector<std::string> kAllSections = {"pipe",   "floor", "redis",   "idle", "paced",
                                               "closed", "kill",  "scripts", "tags", "daemon"};
const std::vector<std::string> kSections = [] {
  std::vector<std::string> s = kAllSections;
  s.push_back("scale");
  s.push_back("logs");
  return s;
}();

// Row ids (the first column of the JSON rows) and group names accepted by --rows, mapped to the
// sections that measure them and their comparisons.
const std::map<std::string, std::vector<std::string>> kAliases = {
    {"all", kAllSections},
    {"floors", {"pipe", "floor"}},
    {"latency", {"pipe", "floor", "redis", "idle", "paced"}},
    {"cpu", {"floor", "paced", "closed"}},
    {"supervision", {"kill", "scripts"}},
    {"rss", {"idle", "scripts"}},
    {"peer", {"redis"}},
    {"host_cpu", {"floor", "redis", "paced"}},
    {"host_cpu_minus_inprocess", {"paced"}},
    {"host_cpu_over_floor", {"floor", "paced"}},
    {"host_cpu_over_hop_floor", {"floor", "paced"}},
    {"host_us_closed", {"redis", "closed"}},
    {"worker_us_closed", {"redis", "closed"}},
    {"host_us_paced", {"floor", "redis", "paced"}},
    {"worker_us_paced", {"floor", "redis", "paced"}},
    {"wakeups_paced", {"floor", "redis", "paced"}},
    {"idle_p50", {"pipe", "redis", "idle"}},
    {"idle_p99", {"pipe", "redis", "idle"}},
    {"wakeups_idle", {"idle"}},
    {"paced_p50", {"floor", "redis", "paced"}},
    {"paced_p99", {"floor", "redis", "paced"}},
    {"paced_p999", {"floor", "redis", "paced"}},
    {"closed_loop", {"redis", "closed"}},
    {"rss_idle", {"idle"}},
    {"rss_scripts", {"scripts"}},
    {"kill_latency", {"kill"}},
    {"warm_restart", {"scripts"}},
    {"kill_all", {"scripts"}},
    {"shard_kill", {"kill"}},
    {"idle_cpu", {"idle"}},
    {"tags", {"paced", "tags"}},
    {"tags_p99", {"paced", "tags"}},
    {"tags_us", {"paced", "tags"}},
    {"daemon", {"redis", "daemon"}},
    {"daemon_p50", {"redis", "daemon"}},
    {"daemon_p99", {"redis", "daemon"}},
    {"daemon_pipelined", {"redis", "daemon"}},
    {"daemon_us_pipelined", {"redis", "daemon"}},
    {"daemon_us_single", {"redis", "daemon"}},
    {"daemon_switches_single", {"redis", "daemon"}},
    {"daemon_switches_pipelined", {"redis", "daemon"}},
    {"scale_rss", {"scale"}},
    {"scale_paced_p99", {"scale"}},
    {"scale_warm_restart", {"scale"}},
    {"scale_kill_all", {"scale"}},
    {"log_script", {"logs"}},
};

// ---------------------------------------------------------------- helpers

// Results checked and wrong: per sample (figures all.checked / all.wrong) and for the whole run.
std::atomic<int64_t> g_checked{0}, g_wrong{0}, g_profile_wrong{0};
void count_checked(Figs& f, double checked, double wrong) {
  f["all.checked"] += checked;
  f["all.wrong"] += wrong;
  g_checked += static_cast<int64_t>(checked);
  g_wrong += static_cast<int64_t>(wrong);
}

// Diagnostics beside the figures (per-thread breakdowns of the last repeat), for print and JSON.
nlohmann::json g_diag = nlohmann::json::object();
nlohmann::json threads_json(const std::vector<ThreadFig>& threads) {
  nlohmann::json j = nlohmann::json::array();
  for (const ThreadFig& t : threads)
    j.push_back({{"tid", t.tid},
                 {"main", t.main},
                 {"cpu_pct", t.cpu_pct},
                 {"wakeups_per_eval", t.wakeups_per_msg}});
  return j;
}

std::vector<Script> register_keys(Runner& r, int n) {
  std::vector<Script> s(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k)
    setup_ok(r.register_script("perf.avg." + std::to_string(k), kScript,
                               &s[static_cast<std::size_t>(k)]),
             "register perf.avg." + std::to_string(k));  // its evaluations are counted wrong
  return s;
}

// Evaluates every script once (compiles it on its worker); returns the wrong ones.
int64_t warm(Runner& r, const std::vector<Script>& s) {
  int64_t wrong = 0;
  for (std::size_t k = 0; k < s.size(); ++k)
    wrong += !check(r.evaluate(s[k], inputs_for(static_cast<int64_t>(k))).get(),
                    static_cast<int64_t>(k));
  return wrong;
}

void put_latency(Figs& f, const std::string& prefix, const LatencyFig& l, bool p999) {
  f[prefix + "_p50_us"] = l.p50_us;
  f[prefix + "_p99_us"] = l.p99_us;
  if (p999) f[prefix + "_p999_us"] = l.p999_us;
}

// ---------------------------------------------------------------- A/B knobs

bool parse_bool(const std::string& v, bool* out) {
  if (v == "true" || v == "1" || v == "on" || v == "yes") return *out = true, true;
  if (v == "false" || v == "0" || v == "off" || v == "no") return *out = false, true;
  return false;
}

template <class O>
concept HasWorkerProfile = requires(O o) {
  o.worker_profile_prefix = std::string();
};
template <class O>
concept HasAddressSpaceLimit = requires(O o) {
  o.worker_address_space_limit = std::size_t{};
};

// Sets HostOptions::worker_profile_prefix where this version of the host has it.
template <class O>
bool set_worker_profile_prefix(O& o, const std::string& prefix) {
  if constexpr (HasWorkerProfile<O>) {
    o.worker_profile_prefix = prefix;
    return true;
  } else {
    return false;
  }
}

template <class O>
bool set_address_space_limit(O& o, std::size_t v) {
  if constexpr (HasAddressSpaceLimit<O>) {
    o.worker_address_space_limit = v;
    return true;
  } else {
    return false;
  }
}

// Applies one `name=value` to HostOptions. Durations in ms, sizes in bytes.
bool apply_knob(HostOptions& o, const std::string& name, const std::string& value,
                std::string* err) {
  try {
    auto ms = [&] { return std::chrono::milliseconds(std::stoll(value)); };
    bool b = false;
    if (name == "shards") {
      o.shards = std::stoi(value);
    } else if (name == "timeout") {
      o.timeout = ms();
    } else if (name == "grace") {
      o.grace = ms();
    } else if (name == "memory_limit") {
      o.memory_limit = std::stoull(value);
    } else if (name == "start_timeout") {
      o.start_timeout = ms();
    } else if (name == "shutdown_timeout") {
      o.shutdown_timeout = ms();
    } else if (name == "worker_large_pages") {
      if (!parse_bool(value, &b)) throw std::invalid_argument("bool");
      o.worker_large_pages = b;
    } else if (name == "fulfill_futures_on_loop") {
      if (!parse_bool(value, &b)) throw std::invalid_argument("bool");
      o.fulfill_futures_on_loop = b;
    } else if (name == "callbacks_on_loop") {
      if (!parse_bool(value, &b)) throw std::invalid_argument("bool");
      o.callbacks_on_loop = b;
    } else if (name == "slow_lane") {
      if (!parse_bool(value, &b)) throw std::invalid_argument("bool");
      o.slow_lane = b;
    } else if (name == "max_queued_while_down") {
      o.max_queued_while_down = std::stoull(value);
    } else if (name == "restart_delay") {
      o.restart_delay = ms();
    } else if (name == "heartbeat_interval") {
      o.heartbeat_interval = ms();
    } else if (name == "silence_limit") {
      o.silence_limit = ms();
    } else if (name == "single_flight") {
      if (value == "refuse")
        o.single_flight = SingleFlight::refuse;
      else if (value == "coalesce_latest")
        o.single_flight = SingleFlight::coalesce_latest;
      else if (value == "off")
        o.single_flight = SingleFlight::off;
      else
        throw std::invalid_argument("refuse|coalesce_latest|off");
    } else if (name == "retries") {
      o.retries = std::stoi(value);
    } else if (name == "crash_loop_limit") {
      o.crash_loop_limit = std::stoi(value);
    } else if (name == "crash_loop_window") {
      o.crash_loop_window = ms();
    } else if (name == "crash_loop_cooldown") {
      o.crash_loop_cooldown = ms();
    } else if (name == "worker_path") {
      o.worker_path = value;
    } else if (name == "bytecode_cache_bytes") {
      o.bytecode_cache_bytes = std::stoull(value);
    } else if (name == "busy_poll") {  // microseconds
      o.busy_poll = std::chrono::microseconds(std::stoll(value));
    } else if (name == "worker_address_space_limit") {
      if (!set_address_space_limit(o, std::stoull(value)))
        throw std::invalid_argument("not in this host");
    } else {
      *err = "unknown HostOptions knob '" + name +
             "' (known: shards timeout grace memory_limit start_timeout shutdown_timeout "
             "fulfill_futures_on_loop callbacks_on_loop "
             "max_queued_while_down restart_delay heartbeat_interval silence_limit single_flight "
             "retries "
             "crash_loop_limit crash_loop_window crash_loop_cooldown worker_path busy_poll(us) "
             "worker_address_space_limit worker_large_pages bytecode_cache_bytes)";
      return false;
    }
  } catch (const std::exception& e) {
    *err = "bad value '" + value + "' for " + name + " (" + e.what() + ")";
    return false;
  }
  return true;
}

struct ArmSpec {
  std::string name, spec;
  std::vector<std::pair<std::string, std::string>> knobs;
  bool sets_single_flight = false;
};

bool parse_arm(const std::string& spec, ArmSpec* out, std::string* err) {
  out->spec = spec;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      *err = "A/B arm item '" + item + "' is not name=value";
      return false;
    }
    out->knobs.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    if (item.substr(0, eq) == "single_flight") out->sets_single_flight = true;
    HostOptions probe;
    if (!apply_knob(probe, out->knobs.back().first, out->knobs.back().second, err)) return false;
  }
  // The whole arm must be a valid HostOptions (the rules Host::create enforces).
  HostOptions probe;
  for (const auto& [name, value] : out->knobs) apply_knob(probe, name, value, err);
  if (Error e = validate(probe)) {
    *err = "A/B arm '" + spec + "': " + e.message;
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- measurements

using HookFactory = std::function<WindowHooks(const std::string& section, Host* host)>;

struct IdleFig {
  LatencyFig lat;
  double wakeups = 0, other_wakeups = 0;  // per round trip: this process, `pids`
};

// Sequential round trips through futures (the caller waits for each), or with `sync` through
// evaluate_sync (the caller reads its result itself: leader/follower).
IdleFig idle_latency(Runner& r, const std::vector<Script>& s, int iterations, int64_t* wrong,
                     const std::vector<int>& pids = {}, bool sync = false) {
  LatencyHistogram h;
  Window w;
  w.pids = pids;
  for (int i = 0; i < iterations + 200; ++i) {
    if (i == 200) w.start();
    const int64_t t0 = mono_ns();
    const Script& script = s[static_cast<std::size_t>(i) % s.size()];
    Result res =
        sync ? r.evaluate_sync(script, inputs_for(i)) : r.evaluate(script, inputs_for(i)).get();
    const int64_t dt = mono_ns() - t0;
    *wrong += !check(res, i);
    if (i >= 200) h.record(dt);
  }
  w.stop();
  const double n = std::max(1, iterations);
  return {latency_of(h), static_cast<double>(w.wakeups) / n,
          static_cast<double>(w.others_wakeups) / n};
}

// Open loop at o.rate over the scripts `s` in turn, callbacks (dispatcher threads for the host).
PacedFig paced_runner(Runner& r, const std::vector<Script>& s, const Options& o,
                      const std::vector<int>& pids, WindowHooks hooks) {
  const std::size_t n = s.size();
  return paced_load(
      r, s, o.rate, o.warmup, o.duration, pids, std::move(hooks),
      [n](int64_t i) { return static_cast<std::size_t>(i) % n; },
      [](const Result& res, int64_t i) { return check(res, i); });
}

struct ClosedFig {
  double per_s = 0, host_us = 0, others_us = 0;
  double wakeups = 0, other_wakeups = 0;  // per evaluation
  int64_t evaluations = 0, wrong = 0;
};

// Closed loop: keeps up to kDepth evaluations in flight, submitted in batches of kBatch over the
// scripts `s`; checks every result.
ClosedFig closed_loop(Runner& r, const std::vector<Script>& s, double seconds,
                      const std::vector<int>& pids, WindowHooks hooks) {
  constexpr int64_t kBatch = 512;
  constexpr int64_t kDepth = 8 * kBatch;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int64_t> in_flight{0}, completed{0}, wrong{0};
  int64_t next = 0;
  const std::size_t n = s.size();
  auto submit = [&](int64_t first) {
    std::vector<Request> reqs;
    reqs.reserve(kBatch);
    for (int64_t k = 0; k < kBatch; ++k)
      reqs.push_back({s[static_cast<std::size_t>(first + k) % n], inputs_for(first + k)});
    r.evaluate_batch(std::move(reqs), [&, first](std::size_t k, Result res) {
      if (!check(res, first + static_cast<int64_t>(k)))
        wrong.fetch_add(1, std::memory_order_relaxed);
      completed.fetch_add(1, std::memory_order_relaxed);
      const int64_t left = in_flight.fetch_sub(1, std::memory_order_acq_rel) - 1;
      if (left == kDepth - kBatch || left == 0) {
        std::lock_guard lock(mu);
        cv.notify_one();
      }
    });
  };
  Window w;
  w.pids = pids;
  hooks.start();
  w.start();
  const int64_t end = w.wall0 + static_cast<int64_t>(seconds * 1e9);
  while (mono_ns() < end) {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return in_flight.load() <= kDepth - kBatch; });
    }
    in_flight.fetch_add(kBatch);
    submit(next);
    next += kBatch;
  }
  {
    std::unique_lock lock(mu);
    cv.wait_for(lock, std::chrono::seconds(30), [&] { return in_flight.load() == 0; });
  }
  w.stop();
  hooks.stop();
  ClosedFig f;
  f.evaluations = completed.load();
  f.wrong = wrong.load() + (next - f.evaluations);
  const double nev = static_cast<double>(std::max<int64_t>(1, f.evaluations));
  f.per_s = static_cast<double>(f.evaluations) / (static_cast<double>(w.wall_ns) / 1e9);
  f.host_us = us(w.cpu_ns) / nev;
  f.others_us = us(w.others_ns) / nev;
  f.wakeups = static_cast<double>(w.wakeups) / nev;
  f.other_wakeups = static_cast<double>(w.others_wakeups) / nev;
  return f;
}

// Idle CPU of this process and of `pids` over `seconds`, % of a core.
std::pair<double, double> idle_cpu(const std::vector<int>& pids, double seconds) {
  Window w;
  w.pids = pids;
  w.start();
  sleep_ns(static_cast<int64_t>(seconds * 1e9));
  w.stop();
  return {w.cpu_pct(), w.others_pct()};
}

// ---- sections

void floor_sections(const Options& o, const std::set<std::string>& sel, Figs& f,
                    const HookFactory& hooks_for) {
  if (sel.count("pipe")) {
    const LatencyFig pipe = pipe_round_trip(o.iterations);
    put_latency(f, "pipe.rt", pipe, true);
  }
  if (sel.count("floor")) {
    const PacedFig pacing = pacing_only(o.rate, o.warmup, o.duration);
    f["floor.pacing_cpu_pct"] = pacing.cpu_pct;
    f["floor.pacing_us_per_msg"] = pacing.us_per_msg;
    f["floor.pacing_wakeups_per_msg"] = pacing.wakeups_per_msg;
    struct Variant {
      const char* prefix;
      bool hop, pipes;
    };
    for (const Variant v : {Variant{"floor.shape", false, false}, Variant{"floor.hop", true, false},
                            Variant{"floor.hop_pipes", true, true}}) {
      const std::string p = v.prefix;
      const bool hop = v.hop && !v.pipes;
      const PacedFig s = bare_shape(o.rate, o.warmup, o.duration, v.hop,
                                    hooks_for(hop ? "floor" : "", nullptr), v.pipes);
      f[p + "_cpu_pct"] = s.cpu_pct;
      f[p + "_us_per_msg"] = s.us_per_msg;
      f[p + "_echo_cpu_pct"] = s.other_cpu_pct;
      f[p + "_echo_us_per_msg"] = s.other_us_per_msg;
      f[p + "_rate_per_s"] = s.achieved_per_s;
      f[p + "_wakeups_per_msg"] = s.wakeups_per_msg;
      f[p + "_echo_wakeups_per_msg"] = s.other_wakeups_per_msg;
      if (hop) g_diag["threads"]["bare shape + hop"] = threads_json(s.threads);
      put_latency(f, p, s.lat, true);
      count_checked(f, static_cast<double>(s.measured), static_cast<double>(s.wrong));
    }
  }
}

void redis_sections(const Options& o, RedisServer& srv, const std::string& sha, Figs& f) {
  int64_t wrong = 0;
  ProcsCost single_cost;
  const LatencyFig single = redis_single_client(srv, sha, o.iterations, &wrong, &single_cost);
  put_latency(f, "redis.single", single, false);
  const double measured = static_cast<double>(std::max<uint64_t>(1, single.n));
  f["redis.single_server_us_per_eval"] = us(single_cost.cpu_ns) / measured;
  f["redis.single_server_switches_per_eval"] =
      static_cast<double>(single_cost.switches()) / measured;
  count_checked(f, static_cast<double>(single.n), static_cast<double>(wrong));
  const PacedFig p = redis_paced(srv, sha, o.rate, o.warmup, o.duration);
  put_latency(f, "redis.paced", p.lat, true);
  f["redis.paced_client_cpu_pct"] = p.cpu_pct;
  f["redis.paced_client_us_per_eval"] = p.us_per_msg;
  f["redis.paced_server_cpu_pct"] = p.other_cpu_pct;
  f["redis.paced_server_us_per_eval"] = p.other_us_per_msg;
  f["redis.paced_rate_per_s"] = p.achieved_per_s;
  f["redis.paced_client_wakeups_per_eval"] = p.wakeups_per_msg;
  f["redis.paced_server_wakeups_per_eval"] = p.other_wakeups_per_msg;
  count_checked(f, static_cast<double>(p.measured), static_cast<double>(p.wrong));
  const RedisPipelinedFig pl =
      redis_pipelined(srv, sha, o.redis_clients, o.redis_depth, o.closed_duration);
  f["redis.pipelined_per_s"] = pl.evals_per_s;
  f["redis.pipelined_client_us_per_eval"] = pl.client_cpu_us_per_eval;
  f["redis.pipelined_server_us_per_eval"] = pl.server_cpu_us_per_eval;
  f["redis.pipelined_server_switches_per_eval"] = pl.server_switches_per_eval;
  count_checked(f, static_cast<double>(pl.evaluations), static_cast<double>(pl.wrong));
}

void put_cost(Figs& f, const std::string& prefix, const DaemonCost& c) {
  f[prefix + "_us_per_eval"] = c.total_us();
  f[prefix + "_daemon_us_per_eval"] = c.daemon_us;
  f[prefix + "_workers_us_per_eval"] = c.workers_us;
  f[prefix + "_daemon_switches_per_eval"] = c.daemon_switches;
  f[prefix + "_workers_switches_per_eval"] = c.workers_switches;
  f[prefix + "_daemon_wakeups_per_eval"] = c.daemon_voluntary;
  f[prefix + "_workers_wakeups_per_eval"] = c.workers_voluntary;
}

// outrund as a server, the same script, socket kind and client counts as redis_sections: one
// client through raw frames (and once more through outrun::Client), then pipelined.
void daemon_sections(const Options& o, const DaemonServer& d, Figs& f) {
  const DaemonSingleFig single = daemon_single_client(d, o.iterations);
  put_latency(f, "daemon.single", single.lat, false);
  put_cost(f, "daemon.single", single.cost);
  count_checked(f, static_cast<double>(single.lat.n), static_cast<double>(single.wrong));
  {
    ClientOptions co;
    co.socket = d.socket_path();
    co.name = "outrun-perf";
    std::unique_ptr<Client> client;
    if (Error err = Client::connect(co, &client)) {
      std::fprintf(stderr, "outrun-perf: outrun::Client: %s\n", err.message.c_str());
      count_checked(f, 1, 1);
    } else {
      const std::vector<Script> s = register_keys(*client, o.keys);
      count_checked(f, static_cast<double>(s.size()), static_cast<double>(warm(*client, s)));
      int64_t wrong = 0;
      const IdleFig l = idle_latency(*client, s, o.iterations, &wrong);
      put_latency(f, "daemon.client", l.lat, false);
      count_checked(f, static_cast<double>(l.lat.n), static_cast<double>(wrong));
    }
  }
  const DaemonPipelinedFig pl =
      daemon_pipelined(d, o.redis_clients, o.redis_depth, o.closed_duration);
  f["daemon.pipelined_per_s"] = pl.evals_per_s;
  f["daemon.pipelined_client_us_per_eval"] = pl.client_cpu_us_per_eval;
  put_cost(f, "daemon.pipelined", pl.cost);
  count_checked(f, static_cast<double>(pl.evaluations), static_cast<double>(pl.wrong));
}

void inprocess_sections(const Options& o, const std::set<std::string>& sel, Figs& f) {
  if (!sel.count("idle") && !sel.count("paced") && !sel.count("closed")) return;
  InProcess ip;
  const std::vector<Script> s = register_keys(ip, o.keys);
  count_checked(f, static_cast<double>(s.size()), static_cast<double>(warm(ip, s)));
  if (sel.count("idle")) {
    int64_t wrong = 0;
    const IdleFig l = idle_latency(ip, s, o.iterations, &wrong);
    put_latency(f, "inproc.idle", l.lat, false);
    count_checked(f, static_cast<double>(l.lat.n), static_cast<double>(wrong));
  }
  if (sel.count("paced")) {
    const PacedFig p = paced_runner(ip, s, o, {}, {});
    f["inproc.paced_cpu_pct"] = p.cpu_pct;
    f["inproc.paced_us_per_eval"] = p.us_per_msg;
    f["inproc.paced_wakeups_per_eval"] = p.wakeups_per_msg;
    put_latency(f, "inproc.paced", p.lat, true);
    count_checked(f, static_cast<double>(p.measured), static_cast<double>(p.wrong));
  }
  if (sel.count("closed")) {
    const ClosedFig c = closed_loop(ip, s, o.closed_duration, {}, {});
    f["inproc.closed_per_s"] = c.per_s;
    f["inproc.closed_us_per_eval"] = c.host_us;
    count_checked(f, static_cast<double>(c.evaluations), static_cast<double>(c.wrong));
  }
}

bool host_main_sections(const Options& o, const HostOptions& ho, const std::set<std::string>& sel,
                        Figs& f, const HookFactory& hooks_for, const std::string& arm_name = "") {
  if (!sel.count("idle") && !sel.count("paced") && !sel.count("closed") && !sel.count("logs"))
    return true;
  std::unique_ptr<Host> host;
  if (Error err = Host::create(ho, &host)) {
    std::fprintf(stderr, "outrun-perf: cannot start the host: %s\n", err.message.c_str());
    return false;
  }
  const std::vector<Script> s = register_keys(*host, o.keys);
  count_checked(f, static_cast<double>(s.size()), static_cast<double>(warm(*host, s)));
  const std::vector<int> pids = host->worker_pids();
  double idle_host = 0, idle_workers = 0;
  if (sel.count("idle") || sel.count("paced")) {
    f["worker.rss_idle_mb"] = max_rss_mb(pids);
    sleep_ns(200'000'000);
    std::tie(idle_host, idle_workers) = idle_cpu(pids, o.idle_seconds);
    f["host.idle_cpu_pct"] = idle_host;
    f["workers.idle_cpu_pct"] = idle_workers;
  }
  if (sel.count("idle")) {
    int64_t wrong = 0;
    const IdleFig l = idle_latency(*host, s, o.iterations, &wrong, host->worker_pids());
    put_latency(f, "host.idle", l.lat, false);
    f["host.idle_wakeups_per_eval"] = l.wakeups;
    f["workers.idle_wakeups_per_eval"] = l.other_wakeups;
    count_checked(f, static_cast<double>(l.lat.n), static_cast<double>(wrong));
    const IdleFig ls = idle_latency(*host, s, o.iterations, &wrong, host->worker_pids(), true);
    put_latency(f, "host.idle_sync", ls.lat, false);
    f["host.idle_sync_wakeups_per_eval"] = ls.wakeups;
    count_checked(f, static_cast<double>(ls.lat.n), static_cast<double>(wrong));
  }
  if (sel.count("paced")) {
    const PacedFig p =
        paced_runner(*host, s, o, host->worker_pids(), hooks_for("paced", host.get()));
    f["host.paced_cpu_pct"] = p.cpu_pct;
    f["host.paced_us_per_eval"] = p.us_per_msg;
    f["workers.paced_cpu_pct"] = p.other_cpu_pct;
    f["workers.paced_us_per_eval"] = p.other_us_per_msg;
    f["host.paced_rate_per_s"] = p.achieved_per_s;
    f["host.paced_wakeups_per_eval"] = p.wakeups_per_msg;
    f["workers.paced_wakeups_per_eval"] = p.other_wakeups_per_msg;
    g_diag["threads"]["host, " + arm_name] = threads_json(p.threads);
    // Net of what the same host and workers burn while idle (heartbeats, watchdog).
    f["host.paced_us_net"] = p.us_per_msg - idle_host / 100.0 * 1e6 / p.achieved_per_s;
    f["workers.paced_us_net"] = p.other_us_per_msg - idle_workers / 100.0 * 1e6 / p.achieved_per_s;
    put_latency(f, "host.paced", p.lat, true);
    count_checked(f, static_cast<double>(p.measured), static_cast<double>(p.wrong));
  }
  if (sel.count("closed")) {
    const ClosedFig c = closed_loop(*host, s, o.closed_duration, host->worker_pids(),
                                    hooks_for("closed", host.get()));
    f["host.closed_per_s"] = c.per_s;
    f["host.closed_us_per_eval"] = c.host_us;
    f["workers.closed_us_per_eval"] = c.others_us;
    f["host.closed_wakeups_per_eval"] = c.wakeups;
    f["workers.closed_wakeups_per_eval"] = c.other_wakeups;
    count_checked(f, static_cast<double>(c.evaluations), static_cast<double>(c.wrong));
  }
  if (sel.count("logs")) {
    // What a script that prints on every evaluation costs (design/sandbox.md "Script logs"):
    // the same closed loop over the same scripts with and without a print, one after the other
    // on this host. Each script keeps 50 lines a second; its other prints are only counted.
    std::vector<Script> ls(s.size());
    for (std::size_t k = 0; k < s.size(); ++k)
      setup_ok(host->register_script("perf.log." + std::to_string(k),
                                     std::string("print('avg of', inputs.a, inputs.b) ") + kScript,
                                     &ls[k]),
               "register perf.log." + std::to_string(k));
    count_checked(f, static_cast<double>(ls.size()), static_cast<double>(warm(*host, ls)));
    const ClosedFig plain = closed_loop(*host, s, o.closed_duration, host->worker_pids(), {});
    const ClosedFig logging = closed_loop(*host, ls, o.closed_duration, host->worker_pids(), {});
    f["logs.plain_host_us_per_eval"] = plain.host_us;
    f["logs.plain_workers_us_per_eval"] = plain.others_us;
    f["logs.print_host_us_per_eval"] = logging.host_us;
    f["logs.print_workers_us_per_eval"] = logging.others_us;
    f["logs.print_per_s"] = logging.per_s;
    count_checked(f, static_cast<double>(plain.evaluations + logging.evaluations),
                  static_cast<double>(plain.wrong + logging.wrong));
  }
  // No worker may die under these loads: a death here is a finding, not noise.
  uint64_t deaths = 0;
  for (int i = 0; i < host->shards(); ++i) {
    const ShardStats st = host->shard_stats(i);
    deaths += st.deaths;
    if (st.deaths > 0)
      std::fprintf(stderr, "outrun-perf: shard %d: %llu worker death(s) under load%s%s\n", i,
                   static_cast<unsigned long long>(st.deaths), arm_name.empty() ? "" : ", ",
                   (arm_name + ": " + st.last_death).c_str());
  }
  f["host.worker_deaths_count"] = static_cast<double>(deaths);
  return true;
}

// Kill latency after T+G (a runaway stuck in one C call: only the hard kill ends it), and a
// shard kill until its next ok.
bool kill_section(const Options& o, HostOptions ho, Figs& f) {
  ho.timeout = std::chrono::milliseconds(o.timeout_ms);
  ho.grace = std::chrono::milliseconds(o.grace_ms);
  std::unique_ptr<Host> host;
  if (Error err = Host::create(ho, &host)) {
    std::fprintf(stderr, "outrun-perf: cannot start the host: %s\n", err.message.c_str());
    return false;
  }
  Script stuck, ok;
  if (!setup_ok(
          host->register_script(
              "perf.stuck",
              "local s = string.rep('a', 200000) return s:find('.-.-.-.-.-.-.-.-.-b')", &stuck),
          "register perf.stuck") ||
      !setup_ok(host->register_script("perf.ok", kScript, &ok), "register perf.ok"))
    return false;
  const int64_t tg = (int64_t{o.timeout_ms} + o.grace_ms) * 1'000'000;
  LatencyHistogram after_tg, shard_kill;
  int64_t wrong = 0, checked = 0;
  for (int i = 0; i < o.kill_rounds; ++i) {
    wrong += !check(host->evaluate(ok, inputs_for(i)).get(), i);  // up and warm
    // The runaway's own worker up too: after its first kill it runs in the slow lane, whose
    // worker the previous round killed (waiting for that restart is not the kill's latency).
    wrong += !wait_running(*host, host->shard_of(stuck));
    const int64_t t0 = mono_ns();
    const Result r = host->evaluate(stuck, {}).get();
    after_tg.record(mono_ns() - t0 - tg);
    checked += 2;
    if (r.status != Status::killed) {
      ++wrong;
      std::fprintf(stderr, "outrun-perf: the runaway ended %s: %s\n",
                   std::string(to_string(r.status)).c_str(), r.error.c_str());
    }
  }
  const int shard = static_cast<int>(ok.shard());
  for (int i = 0; i < o.kill_rounds; ++i) {
    wrong += !check(host->evaluate(ok, inputs_for(i)).get(), i);
    const uint64_t starts = host->shard_stats(shard).starts;
    const int64_t t0 = mono_ns();
    wrong += !setup_ok(host->kill_shard(shard), "kill_shard");
    // The next evaluation, submitted once the host has seen the death and started a new worker.
    wrong += !wait_restarted(*host, shard, starts);
    wrong += !check(host->evaluate(ok, inputs_for(i)).get(), i);
    shard_kill.record(mono_ns() - t0);
    checked += 2;
  }
  f["kill.after_tg_p50_ms"] = ms(after_tg.quantile(0.5));
  f["kill.after_tg_max_ms"] = ms(after_tg.max());
  f["kill.shard_next_ok_p50_ms"] = ms(shard_kill.quantile(0.5));
  f["kill.shard_next_ok_max_ms"] = ms(shard_kill.max());
  count_checked(f, static_cast<double>(checked), static_cast<double>(wrong));
  return true;
}

// N scripts on shard 0 (more on the others): RSS of the worker holding them; warm restart (kill
// shard 0 -> every one of its scripts' next ok); kill every shard -> the next result of N scripts.
bool scripts_section(const Options& o, const HostOptions& ho, Figs& f) {
  std::unique_ptr<Host> host;
  if (Error err = Host::create(ho, &host)) {
    std::fprintf(stderr, "outrun-perf: cannot start the host: %s\n", err.message.c_str());
    return false;
  }
  std::vector<Script> all, on0;
  for (int i = 0; static_cast<int>(on0.size()) < o.scripts; ++i) {
    Script s;
    if (!setup_ok(host->register_script("tag." + std::to_string(i), tag_source(i), &s),
                  "register tag." + std::to_string(i)))
      return false;
    all.push_back(s);
    if (s.shard() == 0) on0.push_back(s);
  }
  int64_t wrong = 0, checked = 0;
  int64_t t0 = mono_ns();
  wrong += run_all(*host, all, 1);
  checked += static_cast<int64_t>(all.size());
  f["scripts.cold_ms"] = ms(mono_ns() - t0);
  const std::vector<int> pids = host->worker_pids();
  f["scripts.rss_mb"] = static_cast<double>(rss_kb(pids[0])) / 1024.0;
  if (pids.size() > 1) {
    std::vector<int> others(pids.begin() + 1, pids.end());
    f["scripts.rss_other_mb"] = max_rss_mb(others);
  }
  f["scripts.on_shard0_count"] = static_cast<double>(on0.size());

  // Warm restart of shard 0.
  uint64_t starts = host->shard_stats(0).starts;
  t0 = mono_ns();
  wrong += !setup_ok(host->kill_shard(0), "kill_shard");
  wrong += !wait_restarted(*host, 0, starts);
  const int64_t t_spawned = mono_ns();
  wrong += run_all(*host, on0, 2);
  const int64_t t_done = mono_ns();
  f["scripts.warm_restart_ms"] = ms(t_done - t0);
  // Where the time goes: the death seen and a new worker spawned (restart_delay included), then
  // the sources re-sent with the evaluations, compiled, run and answered.
  f["scripts.warm_restart_spawn_ms"] = ms(t_spawned - t0);
  f["scripts.warm_restart_run_ms"] = ms(t_done - t_spawned);
  f["scripts.warm_restart_compiles_count"] =
      static_cast<double>(host->shard_stats(0).worker_compiles);
  checked += static_cast<int64_t>(on0.size());

  // Kill every shard -> the next result of the first N scripts (spread over every shard).
  const std::vector<Script> first(
      all.begin(),
      all.begin() + std::min<std::size_t>(all.size(), static_cast<std::size_t>(o.scripts)));
  std::vector<uint64_t> before;
  for (int i = 0; i < host->shards(); ++i) before.push_back(host->shard_stats(i).starts);
  t0 = mono_ns();
  for (int i = 0; i < host->shards(); ++i) wrong += !setup_ok(host->kill_shard(i), "kill_shard");
  for (int i = 0; i < host->shards(); ++i)
    wrong += !wait_restarted(*host, i, before[static_cast<std::size_t>(i)]);
  wrong += run_all(*host, first, 3);
  f["scripts.kill_all_ms"] = ms(mono_ns() - t0);
  // The same N scripts in InProcess (the same sandbox, no process, no pipe): what creating their
  // states and compiling them costs by itself, on one thread as in one worker.
  {
    InProcess ip;
    t0 = mono_ns();
    std::vector<Script> local(on0.size());
    for (std::size_t k = 0; k < on0.size(); ++k) {
      wrong += !setup_ok(ip.register_script(on0[k].key(), on0[k].source(), &local[k]),
                         "in-process register " + on0[k].key());
      wrong += ip.run(local[k], {{"a", 2}, {"b", 0}}).status != Status::ok;
    }
    f["scripts.inproc_cold_ms"] = ms(mono_ns() - t0);
    checked += static_cast<int64_t>(on0.size());
  }
  f["scripts.kill_all_count"] = static_cast<double>(first.size());
  checked += static_cast<int64_t>(first.size());
  count_checked(f, static_cast<double>(checked), static_cast<double>(wrong));
  return true;
}

void derive(Figs& f) {
  auto has = [&](const char* id) { return f.count(id) > 0; };
  if (has("host.paced_cpu_pct") && has("inproc.paced_cpu_pct"))
    f["host.paced_minus_inproc_pp"] = f["host.paced_cpu_pct"] - f["inproc.paced_cpu_pct"];
  if (has("host.paced_cpu_pct") && has("floor.shape_cpu_pct") && f["floor.shape_cpu_pct"] > 0)
    f["host.paced_over_floor"] = f["host.paced_cpu_pct"] / f["floor.shape_cpu_pct"];
  if (has("host.paced_cpu_pct") && has("floor.hop_cpu_pct") && f["floor.hop_cpu_pct"] > 0)
    f["host.paced_over_hop_floor"] = f["host.paced_cpu_pct"] / f["floor.hop_cpu_pct"];
}

// ---------------------------------------------------------------- machine, profiles

std::string read_first(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      auto colon = line.find(':');
      std::string v = colon == std::string::npos ? line : line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string run_command(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

nlohmann::json machine_json() {
  utsname u{};
  uname(&u);
  return {{"cores", sysconf(_SC_NPROCESSORS_ONLN)},
          {"kernel", std::string(u.sysname) + " " + u.release + " " + u.version},
          {"machine", u.machine},
          {"cpu_model", read_first("/proc/cpuinfo", "model name")},
          {"mem_total", read_first("/proc/meminfo", "MemTotal")}};
}

std::string self_exe() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

std::string worker_binary(const HostOptions& ho) {
  if (!ho.worker_path.empty()) return ho.worker_path;
  if (const char* e = std::getenv("OUTRUN_WORKER")) return e;
  return (fs::path(self_exe()).parent_path() / "outrun-worker").string();
}

std::string pct_list(const std::vector<std::pair<std::string, double>>& v, std::size_t n,
                     double min_pct = 0.5) {
  std::string out;
  for (std::size_t i = 0; i < v.size() && i < n; ++i) {
    if (v[i].second < min_pct) break;
    char b[32];
    std::snprintf(b, sizeof b, " %.1f%%", v[i].second);
    out += (out.empty() ? "" : " · ") + v[i].first + b;
  }
  return out;
}

void print_ranking(const std::string& title, const Ranking& r, nlohmann::json* out) {
  if (!r.error.empty()) {
    std::printf("  %s: %s\n", title.c_str(), r.error.c_str());
    out->push_back({{"title", title}, {"error", r.error}});
    return;
  }
  std::printf("  %s, %ld samples\n", title.c_str(), r.total_samples);
  std::printf("    by thread:    %s\n", pct_list(r.threads, 8).c_str());
  std::printf("    by component: %s\n", pct_list(r.components, 12).c_str());
  for (const auto& [role, share] : r.threads) {
    if (share < 2) continue;
    std::printf("    %-36s %s\n", (role + ":").c_str(), pct_list(r.by_thread.at(role), 6).c_str());
  }
  std::printf("    top leaf functions: %s\n", pct_list(r.top, 8).c_str());
  auto to_json = [](const std::vector<std::pair<std::string, double>>& v) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& [k, pct] : v) j.push_back({{"name", k}, {"pct", pct}});
    return j;
  };
  nlohmann::json by_thread = nlohmann::json::object();
  for (const auto& [role, comps] : r.by_thread) by_thread[role] = to_json(comps);
  out->push_back({{"title", title},
                  {"samples", r.total_samples},
                  {"threads", to_json(r.threads)},
                  {"components", to_json(r.components)},
                  {"by_thread", by_thread},
                  {"top_leaf_functions", to_json(r.top)}});
}

// gperftools writes /proc/self/maps after a profile's binary trailer (0, 1, 0) when it stops; a
// confined worker cannot open it then. The harness reads /proc/PID/maps while the worker is alive
// and appends it when the file ends at the trailer. Returns false for an empty file.
bool complete_worker_profile(const std::string& path, const std::string& maps) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || size == 0) return false;
  if (size < 24 || maps.empty()) return true;
  uint64_t tail[3] = {};
  {
    std::ifstream in(path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(size - sizeof tail));
    in.read(reinterpret_cast<char*>(tail), sizeof tail);
  }
  if (tail[0] == 0 && tail[1] == 1 && tail[2] == 0) std::ofstream(path, std::ios::app) << maps;
  return true;
}

// Re-runs the chosen windows with the profilers on (the figures of the table stay clean of
// profiling overhead), for o.profile_seconds each, and ranks where the CPU went.
nlohmann::json profile_pass(const Options& o, const HostOptions& main_opts, const std::string& dir,
                            std::vector<std::string>* notes) {
  nlohmann::json out = nlohmann::json::array();
  CpuProfiler& prof = CpuProfiler::get();
  if (!prof.available()) {
    notes->push_back("profile: " + prof.why_unavailable());
    std::printf("profile: %s\n", prof.why_unavailable().c_str());
    return out;
  }
  const std::string pprof = find_pprof();
  if (pprof.empty())
    notes->push_back("profile: google-pprof not found (Debian: google-perftools); raw .prof only");
  fs::create_directories(dir);
  Options po = o;
  po.duration = po.closed_duration = o.profile_seconds;
  std::printf(
      "\nProfiles of the measured window only, %.1f s each (%s; CPUPROFILE_FREQUENCY=%s, capped "
      "by the kernel tick):\n",
      o.profile_seconds, dir.c_str(),
      std::getenv("CPUPROFILE_FREQUENCY") ? std::getenv("CPUPROFILE_FREQUENCY") : "default");
  for (const std::string& row : o.profile_rows) {
    const std::string host_file = dir + "/host." + row + ".prof";
    std::vector<int> signalled;
    std::map<int, std::string> maps;
    bool worker_profiles = false;
    const HookFactory hooks_for = [&](const std::string& section, Host* host) -> WindowHooks {
      if (section != row) return {};
      return {[&, host] {
                if (host && worker_profiles) {
                  signalled = host->worker_pids();
                  for (int pid : signalled)
                    if (pid > 0) {
                      maps[pid] = slurp("/proc/" + std::to_string(pid) + "/maps") + "\n";
                      kill(pid, SIGUSR1);
                    }
                }
                prof.start(host_file);
              },
              [&] {
                prof.stop();
                for (int pid : signalled)
                  if (pid > 0) kill(pid, SIGUSR2);
              }};
    };
    Figs f;
    const std::set<std::string> sel = {row};
    const int64_t wrong_before = g_wrong.load();
    std::string figure, title;
    HostOptions ho = main_opts;
    const std::string prefix = dir + "/worker." + row;
    if (row == "floor") {
      floor_sections(po, sel, f, hooks_for);
      figure = "floor.hop_cpu_pct";
      title = "bare shape + hop (this process)";
    } else if (row == "paced" || row == "closed") {
      worker_profiles = set_worker_profile_prefix(ho, prefix);
      host_main_sections(po, ho, sel, f, hooks_for,
                         "profiled " + row);  // returns after ~Host: worker files complete
      figure = row == "paced" ? "host.paced_cpu_pct" : "host.closed_us_per_eval";
      title = "host process";
    } else {
      notes->push_back("profile: unknown window '" + row + "' (paced, closed, floor)");
      continue;
    }
    const int64_t wrong = g_wrong.load() - wrong_before;
    if (wrong > 0) {
      // Not the product's figures: count them apart (the exit status ignores them).
      g_wrong -= wrong;
      g_profile_wrong += wrong;
      notes->push_back("profile pass '" + row + "': " + std::to_string(wrong) +
                       " results wrong or lost (workers killed while profiling?)");
    }
    std::printf("\n[%s] %s under the profiler: %s = %s\n", row.c_str(), title.c_str(),
                figure.c_str(),
                f.count(figure) ? format_value(f[figure], figure_unit(figure)).c_str() : "?");
    const std::string threads_key = row == "floor" ? "bare shape + hop" : "host, profiled " + row;
    if (g_diag.contains("threads") && g_diag["threads"].contains(threads_key)) {
      std::printf(
          "  threads of this process, exact (schedstat), %% of a core / wake-ups per eval:");
      for (const auto& t : g_diag["threads"][threads_key])
        if (t["cpu_pct"].get<double>() >= 0.5)
          std::printf("  %s%.1f%% / %.2f", t["main"].get<bool>() ? "main " : "",
                      t["cpu_pct"].get<double>(), t["wakeups_per_eval"].get<double>());
      std::printf("\n");
      if (row != "floor") g_diag["threads"].erase(threads_key);
    }
    if (pprof.empty()) continue;
    print_ranking(
        title + " (" + host_file + ")",
        rank_profiles(pprof, self_exe(), {host_file}, host_file + ".txt", ProcessKind::host), &out);
    if (row == "floor") continue;
    if (!worker_profiles) {
      std::printf("  worker profile: not available yet\n");
      notes->push_back("worker profile: not available yet");
      continue;
    }
    std::vector<std::string> files;
    int empty = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("worker." + row + ".", 0) != 0 || e.path().extension() != ".prof") continue;
      const int pid = std::atoi(name.substr(name.find('.', 7) + 1).c_str());
      if (complete_worker_profile(e.path().string(), maps.count(pid) ? maps[pid] : ""))
        files.push_back(e.path().string());
      else
        ++empty;
    }
    if (empty > 0) {
      const std::string why = std::to_string(empty) + " worker profile file(s) " + prefix +
                              ".*prof are empty: the worker could not write its profile "
                              "(design/budgets.md, worker profiles)";
      std::printf("  %s\n", why.c_str());
      notes->push_back(why);
    }
    if (files.empty()) continue;
    std::sort(files.begin(), files.end());
    print_ranking(
        "workers (" + std::to_string(files.size()) + " files, " + prefix + ".*.prof)",
        rank_profiles(pprof, worker_binary(ho), files, prefix + ".txt", ProcessKind::worker), &out);
  }
  return out;
}

// Whether a row's figure must exist when `sections` ran (the smoke test's check).
bool row_expected(const std::string& fig, const std::set<std::string>& sections) {
  auto starts = [&](const char* p) { return fig.rfind(p, 0) == 0; };
  auto ran = [&](const char* s) { return sections.count(s) > 0; };
  if (fig == "host.paced_over_floor" || fig == "host.paced_over_hop_floor")
    return ran("paced") && ran("floor");
  if (fig == "scripts.rss_other_mb") return false;  // K=1 has no other worker
  if (starts("host.paced") || starts("workers.paced")) return ran("paced");
  if (starts("host.closed") || starts("workers.closed")) return ran("closed");
  if (starts("host.idle") || starts("worker.rss_idle") || starts("workers.idle"))
    return ran("idle");
  if (starts("kill.")) return ran("kill");
  if (starts("scripts.")) return ran("scripts");
  if (starts("tags.")) return ran("tags");
  if (starts("daemon.")) return ran("daemon");
  if (starts("scale.")) return ran("scale");
  if (starts("logs.")) return ran("logs");
  if (fig == "all.wrong") return true;
  return false;
}

std::string timestamp() {
  std::time_t t = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y%m%d-%H%M%S", std::localtime(&t));
  return b;
}

// ---------------------------------------------------------------- the steps of run()

// "10000,100000" -> {10000, 100000}: false (with *err) unless every item is an integer in
// [1, 1000000] and there is at least one.
bool parse_scale(const std::string& list, std::vector<int>* out, std::string* err) {
  std::vector<int> v;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    std::size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || n < 1 || n > 1'000'000) {
      *err = "'" + item + "' is not a number of scripts in [1, 1000000]";
      return false;
    }
    v.push_back(static_cast<int>(n));
  }
  if (v.empty()) {
    *err = "no number of scripts";
    return false;
  }
  if (out) *out = std::move(v);
  return true;
}

// The command line into *o (with --quick/--smoke defaults and --rows resolved to sections).
// Returns the exit code when the run must end here (--help, a bad flag or row), else nullopt.
std::optional<int> parse_options(int argc, char** argv, Options* out) {
  CLI::App app{
      "outrun-perf: every budget row of BRIEF §5, beside InProcess, this machine's floors and "
      "Redis, in one run"};
  app.set_version_flag("--version", "outrun-perf " OUTRUN_VERSION);
  Options& o = *out;
  std::string rows = "all", profile_rows, scale = "10000,100000";
  app.add_flag("--quick", o.quick, "short run (< 2 min on 2 cores)");
  app.add_flag("--smoke", o.smoke,
               "tiny run for CTest: every row produces a value, every result correct");
  app.add_option("--shards", o.shards, "worker processes (K)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--rate", o.rate, "paced open-loop rate, evaluations/s")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--duration", o.duration, "seconds per paced window")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup", o.warmup, "seconds of paced load before each window")
      ->capture_default_str();
  app.add_option("--closed-duration", o.closed_duration, "seconds per closed-loop arm")
      ->capture_default_str();
  app.add_option("--iterations", o.iterations, "round trips per idle-latency row")
      ->capture_default_str();
  app.add_option("--scripts", o.scripts, "scripts for RSS, warm restart and kill-all rows")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--scale", scale,
                 "scale rows (--rows scale): total scripts over every shard, comma-separated "
                 "(--quick: 10000, --smoke: 300)")
      ->check(CLI::Validator(
          [](std::string& v) {
            std::string err;
            return parse_scale(v, nullptr, &err) ? std::string() : err;
          },
          "N[,N...]"))
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_ms, "T, ms (kill-latency row)")->capture_default_str();
  app.add_option("--grace", o.grace_ms, "G, ms (kill-latency row)")->capture_default_str();
  app.add_option("--kill-rounds", o.kill_rounds, "rounds of the kill rows")->capture_default_str();
  app.add_option("--keys", o.keys, "scripts the paced and closed loads spread over")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option(
         "--rows", rows,
         "what to measure, comma-separated: sections (pipe floor redis idle paced closed "
         "kill scripts tags daemon scale), row ids (host_cpu idle_p50 paced_p99 closed_loop "
         "warm_restart kill_all scale_rss ...: see design/budgets.md) or groups (all floors "
         "latency cpu supervision rss peer); all leaves out scale: --rows all,scale")
      ->capture_default_str();
  app.add_option("--tags-state-dir", o.tags_state_dir,
                 "tags: also the keep_state run with outrund's state store in this directory "
                 "(tags.state_store_*)");
  app.add_option("--repeat", o.repeat, "repeats (figures: min / median / max)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option(
      "--ab", o.ab,
      "A/B of HostOptions knobs: 'name=v[,name=v]|name=v[,name=v]' (same load, alternating)");
  app.add_option("--redis-server", o.redis_binary, "redis-server binary ('none': no Redis column)")
      ->capture_default_str();
  app.add_option("--redis-clients", o.redis_clients, "connections of the pipelined Redis row")
      ->capture_default_str();
  app.add_option("--redis-depth", o.redis_depth, "pipeline depth of the pipelined Redis row")
      ->capture_default_str();
  app.add_option("--outrund", o.outrund_binary,
                 "outrund for the daemon rows (default: next to outrun-perf; 'none': no daemon "
                 "rows)");
  app.add_option("--daemon-inputs", o.daemon_inputs,
                 "how the daemon rows' client sends inputs: nested (protocol 2's inputs_buffer, "
                 "passed to the worker as it is) or plain (protocol 1's inputs, decoded and "
                 "encoded again)")
      ->check(CLI::IsMember({"nested", "plain"}))
      ->capture_default_str();
  app.add_option("--out", o.out_dir, "folder for artifacts (JSON, Markdown, profiles)")
      ->capture_default_str();
  app.add_option("--json", o.json_path, "also write every figure as JSON here");
  app.add_option("--markdown", o.markdown_path, "also write the tables as Markdown here");
  app.add_option("--profile", o.profile_dir,
                 "CPU profiles of the measured windows into DIR (default <out>/profiles-<time>)")
      ->expected(0, 1);
  app.add_option("--profile-rows", profile_rows, "windows to profile: paced,closed,floor")
      ->default_str("paced,closed");
  app.add_option("--profile-seconds", o.profile_seconds,
                 "length of each profiled window (the kernel tick caps samples per CPU-second)")
      ->capture_default_str();
  app.add_flag("--runaway-drill", o.runaway_drill,
               "only the runaway drill: a runaway and an honest neighbour on one shard, the "
               "neighbour's latency with the slow lane off and on (--shards, --timeout, --grace)");
  app.add_option("--drill-rate", o.drill.rate, "runaway drill: neighbour evaluations/s")
      ->capture_default_str();
  app.add_option("--drill-seconds", o.drill.seconds, "runaway drill: seconds per arm")
      ->capture_default_str();
  app.add_option("--drill-runaway", o.drill.runaway_kind,
                 "runaway drill: 0 = `while true do end` (timeout at T), 1 = stuck in a C call "
                 "(killed at T+G)")
      ->capture_default_str();
  app.add_flag("--verbose", o.verbose,
               "keep the host's warnings (kills during the drills) on stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2 (CLI11's own codes are 100+).
    return app.exit(e) == 0 ? 0 : 2;
  }
  o.profile = app.count("--profile") > 0;

  auto unless_given = [&](const char* flag, auto& var, auto value) {
    if (!app.count(flag)) var = value;
  };
  if (o.quick) {
    unless_given("--duration", o.duration, 1.5);
    unless_given("--warmup", o.warmup, 0.3);
    unless_given("--closed-duration", o.closed_duration, 1.0);
    unless_given("--iterations", o.iterations, 2000);
    unless_given("--kill-rounds", o.kill_rounds, 6);
    unless_given("--profile-seconds", o.profile_seconds, 4.0);
    unless_given("--scale", scale, std::string("10000"));
  }
  if (o.smoke) {
    unless_given("--duration", o.duration, 0.3);
    unless_given("--warmup", o.warmup, 0.1);
    unless_given("--closed-duration", o.closed_duration, 0.3);
    unless_given("--iterations", o.iterations, 200);
    unless_given("--kill-rounds", o.kill_rounds, 2);
    unless_given("--scripts", o.scripts, 100);
    unless_given("--profile-seconds", o.profile_seconds, 0.5);
    unless_given("--scale", scale, std::string("300"));
  }
  {
    std::string err;
    if (!parse_scale(scale, &o.scale, &err)) {  // checked by CLI11 already, unless a default
      std::fprintf(stderr, "outrun-perf: --scale: %s\n", err.c_str());
      return 2;
    }
  }
  o.idle_seconds = o.smoke ? 0.2 : o.quick ? 1.0 : 2.0;
  {
    std::stringstream in(rows);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (item.empty()) continue;
      if (auto it = kAliases.find(item); it != kAliases.end()) {
        o.sections.insert(it->second.begin(), it->second.end());
      } else if (std::find(kSections.begin(), kSections.end(), item) != kSections.end()) {
        o.sections.insert(item);
      } else {
        std::fprintf(stderr, "outrun-perf: unknown row '%s'\n", item.c_str());
        return 2;
      }
    }
  }
  if (!profile_rows.empty()) {
    o.profile_rows.clear();
    std::stringstream in(profile_rows);
    std::string item;
    while (std::getline(in, item, ','))
      if (!item.empty()) o.profile_rows.push_back(item);
  }
  return std::nullopt;
}

// The arms: one ("default") or the two sides of --ab, and the HostOptions each gives.
struct Arms {
  std::vector<ArmSpec> specs;
  HostOptions base;  // --shards and the log sink, before any knob

  // The arm's knobs over `base`.
  HostOptions plain_options(const ArmSpec& a) const {
    HostOptions ho = base;
    std::string err;
    for (const auto& [k, v] : a.knobs) apply_knob(ho, k, v, &err);
    return ho;
  }
  // The loads keep several evaluations of a key in flight: single flight off unless an arm says.
  HostOptions main_options(const ArmSpec& a) const {
    HostOptions ho = plain_options(a);
    if (!a.sets_single_flight) ho.single_flight = SingleFlight::off;
    return ho;
  }
};

// False (with the message printed) when --ab does not name two valid arms.
bool build_arms(const Options& o, const LogSink& host_log, Arms* out) {
  std::vector<ArmSpec>& specs = out->specs;
  if (o.ab.empty()) {
    specs.push_back({"default", "as given", {}, false});
  } else {
    const auto bar = o.ab.find('|');
    if (bar == std::string::npos) {
      std::fprintf(stderr, "outrun-perf: --ab needs two arms: 'a=1|a=2'\n");
      return false;
    }
    specs.resize(2);
    specs[0].name = "A";
    specs[1].name = "B";
    std::string err;
    if (!parse_arm(o.ab.substr(0, bar), &specs[0], &err) ||
        !parse_arm(o.ab.substr(bar + 1), &specs[1], &err)) {
      std::fprintf(stderr, "outrun-perf: --ab: %s\n", err.c_str());
      return false;
    }
  }
  out->base.shards = o.shards;
  out->base.log = host_log;
  return true;
}

void print_run_header(const Options& o, const char* mode) {
  std::printf(
      "outrun-perf (%s run): K=%d, rate %.0f/s, paced window %.1f s (+%.1f s warm-up), closed loop "
      "%.1f s, "
      "%d scripts, T=%d G=%d ms, repeat %d%s%s\n",
      mode, o.shards, o.rate, o.duration, o.warmup, o.closed_duration, o.scripts, o.timeout_ms,
      o.grace_ms, o.repeat, o.ab.empty() ? "" : ", A/B ", o.ab.c_str());
  std::printf("script: %s   Redis script: %s\n", kScript, kRedisScript);
  if (o.sections.count("scale")) {
    std::string sizes;
    for (int n : o.scale) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n);
    std::printf("scale: %s scripts (40 lines each) in total over the %d shards\n", sizes.c_str(),
                o.shards);
  }
  std::fflush(stdout);
}

// The servers the harness compares against, one each for the whole run (absent: not measured,
// with a note saying why).
struct Peers {
  std::unique_ptr<RedisServer> redis;
  std::string sha;  // of kRedisScript in `redis`
  std::unique_ptr<DaemonServer> daemon;
};

Peers start_peers(const Options& o, std::vector<std::string>* notes) {
  Peers p;
  if (o.sections.count("redis")) {
    std::string why;
    if (o.redis_binary == "none") {
      why = "--redis-server none";
    } else {
      p.redis = RedisServer::start(o.redis_binary, &why);
      if (p.redis) {
        p.sha = p.redis->load_script();
        if (p.sha.empty()) {
          why = "SCRIPT LOAD failed";
          p.redis.reset();
        }
      }
    }
    if (!p.redis) {
      notes->push_back("Redis column: not measured (" + why + ")");
      std::printf("note: no Redis column: %s\n", why.c_str());
    } else {
      notes->push_back("Redis " + p.redis->version() +
                       " on a Unix socket, no persistence, EVALSHA " + p.sha);
    }
  }
  if (o.sections.count("daemon")) {
    std::string why;
    DaemonServer::Launch l;
    l.binary = o.outrund_binary.empty() ? (fs::path(self_exe()).parent_path() / "outrund").string()
                                        : o.outrund_binary;
    l.shards = o.shards;
    l.keys = o.keys;
    l.script = kScript;
    set_daemon_nested_inputs(o.daemon_inputs == "nested");
    if (o.outrund_binary == "none")
      why = "--outrund none";
    else
      p.daemon = DaemonServer::start(l, &why);
    if (!p.daemon) {
      notes->push_back("daemon rows: not measured (" + why + ")");
      std::printf("note: no daemon rows: %s\n", why.c_str());
    } else {
      notes->push_back(
          "outrund " + l.binary + " on a Unix socket, K=" + std::to_string(o.shards) +
          ", single flight off, the script under " + std::to_string(o.keys) +
          " keys round robin; its workers: " + std::to_string(p.daemon->worker_pids().size()));
    }
  }
  return p;
}

// Every repeat: the sections shared by the arms (floors, peers, InProcess), then each arm's
// host sections, in ABBA order; one sample per arm and repeat. False when a host did not start.
bool run_repeats(const Options& o, const Arms& arms_in, Peers& peers, std::vector<Arm>* arms) {
  const std::vector<ArmSpec>& specs = arms_in.specs;
  arms->resize(specs.size());
  for (std::size_t a = 0; a < specs.size(); ++a) {
    (*arms)[a].name = specs[a].name;
    (*arms)[a].spec = specs[a].spec;
  }
  const HookFactory no_hooks = [](const std::string&, Host*) { return WindowHooks{}; };
  bool ok = true;
  for (int r = 0; r < o.repeat; ++r) {
    if (o.repeat > 1) std::fprintf(stderr, "outrun-perf: repeat %d/%d\n", r + 1, o.repeat);
    g_diag["loadavg_per_repeat"].push_back(slurp("/proc/loadavg"));
    Figs shared;
    floor_sections(o, o.sections, shared, no_hooks);
    if (peers.redis) redis_sections(o, *peers.redis, peers.sha, shared);
    if (peers.daemon) daemon_sections(o, *peers.daemon, shared);
    inprocess_sections(o, o.sections, shared);
    std::vector<std::size_t> order(specs.size());
    for (std::size_t a = 0; a < order.size(); ++a)
      order[a] = r % 2 ? order.size() - 1 - a : a;  // ABBA
    for (std::size_t a : order) {
      Figs f = shared;
      ok &= host_main_sections(o, arms_in.main_options(specs[a]), o.sections, f, no_hooks,
                               specs[a].name + " (" + specs[a].spec + ")");
      const HostOptions plain = arms_in.plain_options(specs[a]);
      if (o.sections.count("kill")) ok &= kill_section(o, plain, f);
      if (o.sections.count("scripts")) ok &= scripts_section(o, plain, f);
      if (o.sections.count("tags"))
        ok &=
            tags_section(TagsParams{o.rate, o.warmup, o.duration, 250, o.tags_state_dir}, plain, f,
                         [&f](double checked, double wrong) { count_checked(f, checked, wrong); });
      // The paced load visits each script once per N / rate; single flight off (unless the arm
      // sets it), as for the other loads, so a small N with slow results queues, not `busy`.
      if (o.sections.count("scale"))
        ok &= scale_section(
            ScaleParams{o.scale, o.rate, o.warmup, o.duration}, arms_in.main_options(specs[a]), f,
            [&f](double checked, double wrong) { count_checked(f, checked, wrong); });
      derive(f);
      (*arms)[a].samples.push_back(std::move(f));
    }
  }
  for (Arm& a : *arms) a.aggregate();
  return ok;
}

// The budget rows judged per arm: printed (text), into `md` and `json_arms`. False when a row of
// a measured section produced no value.
bool evaluate_and_print_rows(const Options& o, const std::vector<RowDef>& defs,
                             const std::vector<Arm>& arms, std::ostringstream& md,
                             nlohmann::json* json_arms) {
  bool missing = false;
  for (const Arm& a : arms) {
    const std::vector<RowResult> results = evaluate_rows(defs, a);
    std::printf("\n%s\n", arms.size() > 1 ? ("arm " + a.name + ": " + a.spec).c_str() : "");
    std::printf("%s", text_table(results, o.repeat > 1).c_str());
    md << (arms.size() > 1 ? "\n### arm " + a.name + ": `" + a.spec + "`\n\n" : "\n")
       << markdown_table(results, o.repeat > 1);
    nlohmann::json j = arm_json(a);
    j["rows"] = rows_json(results);
    json_arms->push_back(j);
    // Every row of a measured section has a value (Redis only appears beside them; the daemon
    // rows are not expected with --outrund none).
    for (const RowResult& r : results)
      if (!r.present && row_expected(r.def->figure, o.sections) &&
          !(o.outrund_binary == "none" && r.def->figure.rfind("daemon.", 0) == 0)) {
        std::fprintf(stderr, "outrun-perf: row '%s' produced no value\n", r.def->label.c_str());
        missing = true;
      }
  }
  if (arms.size() == 2) {
    std::printf("\nA/B, median per row (B/A > 1: B is higher):\n%s",
                ab_table(defs, arms[0], arms[1], false).c_str());
    md << "\n### A/B, median per row\n\n" << ab_table(defs, arms[0], arms[1], true);
  }
  return missing;
}

// The per-thread breakdowns of the paced windows (last repeat), as text.
void print_threads() {
  if (!g_diag.contains("threads")) return;
  std::printf(
      "\nThreads of this process over the paced window (last repeat): %% of a core / wake-ups "
      "per "
      "evaluation; 'main' is the pacing (caller) thread\n");
  for (const auto& [name, list] : g_diag["threads"].items()) {
    std::printf("  %-40s", name.c_str());
    for (const auto& t : list)
      if (t["cpu_pct"].get<double>() >= 0.5)
        std::printf("  %s%.1f%% / %.2f", t["main"].get<bool>() ? "main " : "",
                    t["cpu_pct"].get<double>(), t["wakeups_per_eval"].get<double>());
    std::printf("\n");
  }
}

// What the run ended with, for the JSON document and the artifacts.
struct RunSummary {
  std::string stamp, loadavg_at_start;
  const char* mode = "full";
  double run_s = 0;
  int64_t wrong = 0;
};

nlohmann::json run_json(const Options& o, const RunSummary& s, const nlohmann::json& json_arms,
                        const nlohmann::json& profiles, const std::vector<std::string>& notes,
                        const std::vector<RowDef>& defs, const std::vector<Arm>& arms) {
  nlohmann::json j{
      {"tool", "outrun-perf"},
      {"mode", s.mode},
      {"timestamp", s.stamp},
      {"git", run_command("git -C '" OUTRUN_SOURCE_DIR "' describe --always --dirty 2>/dev/null")},
      {"machine", machine_json()},
      {"options",
       {{"shards", o.shards},
        {"rate", o.rate},
        {"duration_s", o.duration},
        {"warmup_s", o.warmup},
        {"closed_duration_s", o.closed_duration},
        {"iterations", o.iterations},
        {"scripts", o.scripts},
        {"scale", o.scale},
        {"timeout_ms", o.timeout_ms},
        {"grace_ms", o.grace_ms},
        {"kill_rounds", o.kill_rounds},
        {"keys", o.keys},
        {"repeat", o.repeat},
        {"rows", std::vector<std::string>(o.sections.begin(), o.sections.end())},
        {"ab", o.ab},
        {"redis_clients", o.redis_clients},
        {"redis_depth", o.redis_depth},
        {"outrund", o.outrund_binary},
        {"daemon_inputs", o.daemon_inputs},
        {"quick", o.quick},
        {"smoke", o.smoke}}},
      {"script", kScript},
      {"redis_script", kRedisScript},
      {"arms", json_arms},
      {"profiles", profiles},
      {"diagnostics", g_diag},
      {"notes", notes},
      {"run_seconds", s.run_s},
      {"results_checked", g_checked.load()},
      {"results_wrong", s.wrong},
  };
  j["machine"]["loadavg_at_start"] = s.loadavg_at_start;
  j["machine"]["loadavg_at_end"] = slurp("/proc/loadavg");
  if (arms.size() == 2) j["ab"] = ab_json(defs, arms[0], arms[1]);
  return j;
}

// The Markdown report: the tables already in `md`, then threads, profiles and notes.
std::string run_markdown(const Options& o, const RunSummary& s, const nlohmann::json& j,
                         std::ostringstream& md, const nlohmann::json& profiles,
                         const std::vector<std::string>& notes) {
  const std::string header = std::string("outrun-perf ") + s.mode + " run, " + s.stamp +
                             ", K=" + std::to_string(o.shards) + ", " +
                             j["machine"]["cpu_model"].get<std::string>() + ", " +
                             std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores\n";
  if (g_diag.contains("threads")) {
    md << "\n### Threads of this process over the paced window (% of a core / wake-ups per "
          "evaluation; main = pacing/caller)\n\n";
    for (const auto& [name, list] : g_diag["threads"].items()) {
      md << "- " << name << ":";
      for (const auto& t : list)
        if (t["cpu_pct"].get<double>() >= 0.5) {
          char b[64];
          std::snprintf(b, sizeof b, " %s%.1f %% / %.2f", t["main"].get<bool>() ? "main " : "",
                        t["cpu_pct"].get<double>(), t["wakeups_per_eval"].get<double>());
          md << b;
        }
      md << "\n";
    }
  }
  if (!profiles.empty()) {
    md << "\n### Profiles of the measured windows\n\n";
    auto list = [](const nlohmann::json& a) {
      std::string out;
      for (const auto& e : a) {
        if (e["pct"].get<double>() < 1) break;
        char b[32];
        std::snprintf(b, sizeof b, " %.1f %%", e["pct"].get<double>());
        out += (out.empty() ? "" : " · ") + e["name"].get<std::string>() + b;
      }
      return out;
    };
    for (const auto& p : profiles) {
      md << "- **" << p["title"].get<std::string>() << "**";
      if (p.contains("error")) {
        md << ": " << p["error"].get<std::string>() << "\n";
        continue;
      }
      md << ", " << p["samples"].get<long>() << " samples\n  - by thread: " << list(p["threads"])
         << "\n  - by component: " << list(p["components"]) << "\n";
    }
  }
  if (!notes.empty()) md << "\n";
  for (const std::string& n : notes) md << "- note: " << n << "\n";
  return "## " + header + md.str();
}

// <out>/outrun-perf-<time>.{json,md}, and the copies --json and --markdown ask for.
void write_artifacts(const Options& o, const RunSummary& s, const nlohmann::json& j,
                     const std::string& markdown) {
  auto write = [&](const std::string& path, const std::string& text) {
    std::ofstream f(path);
    f << text;
    if (!f) std::fprintf(stderr, "outrun-perf: cannot write %s\n", path.c_str());
  };
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (!ec) {
    write(o.out_dir + "/outrun-perf-" + s.stamp + ".json", j.dump(2) + "\n");
    write(o.out_dir + "/outrun-perf-" + s.stamp + ".md", markdown);
    std::printf("artifacts: %s/outrun-perf-%s.{json,md}\n", o.out_dir.c_str(), s.stamp.c_str());
  }
  if (!o.json_path.empty()) write(o.json_path, j.dump(2) + "\n");
  if (!o.markdown_path.empty()) write(o.markdown_path, markdown);
}

}  // namespace

int run(int argc, char** argv) {
  Options o;
  if (std::optional<int> code = parse_options(argc, argv, &o)) return *code;
  if (!o.verbose) spdlog::set_level(spdlog::level::err);
  // The hosts it starts log only errors (all with --verbose), to stderr.
  const LogSink host_log = stderr_log_sink(o.verbose ? LogLevel::debug : LogLevel::error);
  if (o.runaway_drill) {
    HostOptions ho;
    ho.shards = o.shards;
    ho.timeout = std::chrono::milliseconds(o.timeout_ms);
    ho.grace = std::chrono::milliseconds(o.grace_ms);
    ho.log = host_log;
    return runaway_drill(o.drill, ho);
  }
  Arms arm_specs;
  if (!build_arms(o, host_log, &arm_specs)) return 2;

  RunSummary summary;
  summary.stamp = timestamp();
  summary.loadavg_at_start = slurp("/proc/loadavg");
  summary.mode = o.smoke ? "smoke" : o.quick ? "quick" : "full";
  std::vector<std::string> notes;
  const int64_t run_t0 = mono_ns();
  print_run_header(o, summary.mode);

  Peers peers = start_peers(o, &notes);
  std::vector<Arm> arms;
  const bool ok = run_repeats(o, arm_specs, peers, &arms);
  peers = Peers();  // stop them before profiling and reporting

  const std::vector<RowDef> defs =
      budget_rows(o.rate, o.scripts, o.redis_clients, o.redis_depth,
                  o.sections.count("scale") ? o.scale : std::vector<int>{});
  std::ostringstream md;
  nlohmann::json json_arms = nlohmann::json::array();
  const bool missing = evaluate_and_print_rows(o, defs, arms, md, &json_arms);
  print_threads();

  nlohmann::json profiles = nlohmann::json::array();
  if (o.profile) {
    const std::string dir =
        o.profile_dir.empty() ? o.out_dir + "/profiles-" + summary.stamp : o.profile_dir;
    profiles = profile_pass(o, arm_specs.main_options(arm_specs.specs[0]), dir, &notes);
  }
  if (!notes.empty()) std::printf("\n");
  for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
  if (g_profile_wrong > 0)
    std::printf("note: %lld results of the profile pass were wrong or lost (not counted below)\n",
                static_cast<long long>(g_profile_wrong.load()));

  summary.run_s = static_cast<double>(mono_ns() - run_t0) / 1e9;
  summary.wrong = g_wrong.load();
  std::printf("\n%s run took %.1f s; %lld results checked, %lld wrong\n", summary.mode,
              summary.run_s, static_cast<long long>(g_checked.load()),
              static_cast<long long>(summary.wrong));
  const nlohmann::json j = run_json(o, summary, json_arms, profiles, notes, defs, arms);
  write_artifacts(o, summary, j, run_markdown(o, summary, j, md, profiles, notes));

  if (summary.wrong > 0)
    std::fprintf(stderr, "outrun-perf: %lld results were wrong or missing\n",
                 static_cast<long long>(summary.wrong));
  if (missing) std::fprintf(stderr, "outrun-perf: some rows produced no value\n");
  return ok && summary.wrong == 0 && !missing ? 0 : 1;
}

}  // namespace outrun::perf

int main(int argc, char** argv) {
  return outrun::perf::run(argc, argv);
}
