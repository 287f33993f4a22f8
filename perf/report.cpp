#include "report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace outrun::perf {

void Arm::aggregate() {
  agg.clear();
  for (const Figs& s : samples)
    for (const auto& [id, v] : s)
      if (std::isfinite(v)) agg[id].samples.push_back(v);
  for (auto& [id, a] : agg) {
    std::vector<double> v = a.samples;
    std::sort(v.begin(), v.end());
    a.min = v.front();
    a.max = v.back();
    a.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
}

std::optional<double> Arm::median(const std::string& id) const {
  auto it = agg.find(id);
  if (it == agg.end()) return std::nullopt;
  return it->second.median;
}

namespace {

bool ends(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

using Median = std::function<std::optional<double>(const std::string&)>;

Check none() {
  return {"—", nullptr};
}
Check at_most(double limit, std::string text) {
  return {std::move(text),
          [limit](double v, const Median&) { return v <= limit ? Verdict::pass : Verdict::fail; }};
}
Check at_least(double limit, std::string text) {
  return {std::move(text),
          [limit](double v, const Median&) { return v >= limit ? Verdict::pass : Verdict::fail; }};
}
// v <= limit and v <= factor * other (na when `other` was not measured: no Redis).
Check at_most_and_other(double limit, std::string other, double factor, std::string text) {
  return {std::move(text), [=](double v, const Median& m) {
            if (v > limit) return Verdict::fail;
            auto o = m(other);
            if (!o) return Verdict::na;
            return v <= factor * *o ? Verdict::pass : Verdict::fail;
          }};
}
Check at_least_and_other(double limit, std::string other, double factor, std::string text) {
  return {std::move(text), [=](double v, const Median& m) {
            if (v < limit) return Verdict::fail;
            auto o = m(other);
            if (!o) return Verdict::na;
            return v >= factor * *o ? Verdict::pass : Verdict::fail;
          }};
}

std::string rate_text(double rate) {
  char b[32];
  if (rate >= 1000 && std::fmod(rate, 1000) == 0)
    std::snprintf(b, sizeof b, "%.0fk", rate / 1000);
  else
    std::snprintf(b, sizeof b, "%.0f", rate);
  return b;
}

std::size_t width(const std::string& s) {  // code points: every character used here is 1 column
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string pad(const std::string& s, std::size_t w) {
  return s + std::string(w > width(s) ? w - width(s) : 0, ' ');
}

std::string measured_cell(const RowResult& r, bool show_range) {
  if (!r.present) return "not measured";
  const std::string unit = figure_unit(r.def->figure);
  std::string s = format_value(r.median, unit);
  if (show_range && r.samples > 1)
    s += " (" + format_value(r.min, unit) + " – " + format_value(r.max, unit) + ")";
  return s;
}

std::string beside_cell(const RowResult& r, const char* sep) {
  std::string s;
  for (const auto& [label, value] : r.beside) {
    if (!s.empty()) s += sep;
    s += label + " " + value;
  }
  return s;
}

}  // namespace

std::string figure_unit(const std::string& id) {
  if (id.find("_wakeups_per_") != std::string::npos) return "wakeups";
  if (id.find("_switches_per_") != std::string::npos) return "wakeups";
  if (ends(id, "_us") || ends(id, "_us_per_eval") || ends(id, "_us_per_msg") ||
      ends(id, "_us_net") || ends(id, "_us_per_update"))
    return "µs";
  if (ends(id, "_ms")) return "ms";
  if (ends(id, "_pct")) return "%";
  if (ends(id, "_pp")) return "pp";
  if (ends(id, "_per_s")) return "/s";
  if (id.find("_over_") != std::string::npos || ends(id, "_ratio")) return "×";
  if (ends(id, "_mb")) return "MB";
  return "count";
}

std::string format_value(double v, const std::string& unit) {
  char b[64];
  if (unit == "µs")
    std::snprintf(b, sizeof b, v < 10 ? "%.2f µs" : v < 1000 ? "%.1f µs" : "%.0f µs", v);
  else if (unit == "ms")
    std::snprintf(b, sizeof b, v < 10 ? "%.2f ms" : v < 1000 ? "%.1f ms" : "%.0f ms", v);
  else if (unit == "%")
    std::snprintf(b, sizeof b, v < 1 ? "%.2f %%" : "%.1f %%", v);
  else if (unit == "pp")
    std::snprintf(b, sizeof b, "%+.1f %%", v);
  else if (unit == "/s")
    std::snprintf(b, sizeof b,
                  v >= 1e6   ? "%.2f M/s"
                  : v >= 1e3 ? "%.1f k/s"
                             : "%.0f/s",
                  v >= 1e6   ? v / 1e6
                  : v >= 1e3 ? v / 1e3
                             : v);
  else if (unit == "×")
    std::snprintf(b, sizeof b, "%.2f×", v);
  else if (unit == "wakeups")
    std::snprintf(b, sizeof b, "%.2f", v);
  else if (unit == "MB")
    std::snprintf(b, sizeof b, "%.1f MB", v);
  else
    std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

const char* verdict_text(Verdict v) {
  switch (v) {
    case Verdict::pass:
      return "pass";
    case Verdict::fail:
      return "FAIL";
    case Verdict::na:
      return "n/a";
    default:
      return "—";
  }
}

namespace {

// 100000 -> "100,000".
std::string thousands(int v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3)
    s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

// The scale rows of N scripts in total (scale.<N>.* figures, perf/scale.h). The RSS goal is the
// issue's for 100,000 scripts: below that the row is reported, not judged.
std::vector<RowDef> scale_rows(double rate, int n) {
  const std::string r = rate_text(rate);
  const std::string s = thousands(n) + " scripts: ";
  const std::string f = "scale." + std::to_string(n) + ".";
  return {
      {"scale_rss",
       s + "total worker RSS (default budget)",
       f + "rss_total_mb",
       none(),
       n >= 100000 ? at_most(512, "≤ 512 MB") : Check{"≤ 512 MB at 100,000", nullptr},
       {{"largest worker", f + "rss_max_mb"},
        {"evictions", f + "evictions_count"},
        {"compiles", f + "compiles_count"},
        {"register", f + "register_ms"},
        {"cold first run of all", f + "cold_ms"},
        {"after the kills", f + "rss_total_after_mb"}}},
      {"scale_bytecode",
       s + "bytecode the host keeps (compile-only process)",
       f + "bytecode_mb",
       none(),
       none(),
       {{"scripts", f + "bytecode_count"},
        {"compile-only process RSS", f + "compiler_rss_mb"},
        {"all compiled, from the first registration", f + "compile_ahead_ms"}}},
      {"scale_paced_p99",
       s + "p99 at " + r + "/s spread over all",
       f + "paced_p99_us",
       none(),
       at_most(2000, "≤ 2 ms"),
       {{"p50", f + "paced_p50_us"},
        {"p99.9", f + "paced_p999_us"},
        {"evictions", f + "paced_evictions_count"},
        {"compiles", f + "paced_compiles_count"},
        {"workers per evaluation", f + "paced_workers_us_per_eval"}}},
      {"scale_warm_restart",
       s + "warm restart (kill shard 0 → each of its scripts' next ok)",
       f + "warm_restart_ms",
       none(),
       none(),
       {{"on shard 0", f + "warm_restart_count"}, {"compiles", f + "warm_restart_compiles_count"}}},
      {"scale_kill_all",
       s + "kill every shard → every script's next result",
       f + "kill_all_ms",
       none(),
       at_most(2000, "≤ 2 s"),
       {{"compiles", f + "kill_all_compiles_count"},
        {"evictions", f + "kill_all_evictions_count"},
        {"cold first run of all", f + "cold_ms"}}},
  };
}

}  // namespace

std::vector<RowDef> budget_rows(double rate, int scripts, int clients, int depth,
                                const std::vector<int>& scale) {
  const std::string r = rate_text(rate);
  const std::string n = std::to_string(scripts);
  const std::string cd = std::to_string(clients) + " clients × depth " + std::to_string(depth);
  std::vector<RowDef> rows = {
      {"host_cpu",
       "host CPU at " + r + " evals/s (raw, % of a core)",
       "host.paced_cpu_pct",
       none(),
       none(),
       {{"InProcess", "inproc.paced_cpu_pct"},
        {"pacing alone", "floor.pacing_cpu_pct"},
        {"bare shape", "floor.shape_cpu_pct"},
        {"shape+hop", "floor.hop_cpu_pct"},
        {"shape+hop, two pipes", "floor.hop_pipes_cpu_pct"},
        {"Redis client", "redis.paced_client_cpu_pct"},
        {"redis-server", "redis.paced_server_cpu_pct"}}},
      {"host_cpu_minus_inprocess",
       "host CPU at " + r + "/s minus InProcess",
       "host.paced_minus_inproc_pp",
       at_most(25, "≤ 25 % of a core"),
       at_most(10, "≤ +10 % of a core"),
       {}},
      {"host_cpu_over_floor",
       "host CPU / bare-shape floor (no hop)",
       "host.paced_over_floor",
       none(),
       at_most(1.25, "≤ 1.25×"),
       {{"floor", "floor.shape_cpu_pct"}}},
      {"host_cpu_over_hop_floor",
       "host CPU / bare shape + dispatcher hop",
       "host.paced_over_hop_floor",
       none(),
       at_most(1.25, "≤ 1.25×"),
       {{"floor", "floor.hop_cpu_pct"}}},
      {"host_us_closed",
       "host on-CPU per evaluation, closed loop",
       "host.closed_us_per_eval",
       none(),
       at_most(2, "≤ 2 µs"),
       {{"InProcess", "inproc.closed_us_per_eval"},
        {"Redis client", "redis.pipelined_client_us_per_eval"}}},
      {"worker_us_closed",
       "worker on-CPU per evaluation, closed loop",
       "workers.closed_us_per_eval",
       none(),
       none(),
       {{"redis-server", "redis.pipelined_server_us_per_eval"}}},
      {"host_us_paced",
       "host on-CPU per evaluation at " + r + "/s",
       "host.paced_us_per_eval",
       none(),
       none(),
       {{"net of idle", "host.paced_us_net"},
        {"InProcess", "inproc.paced_us_per_eval"},
        {"bare shape", "floor.shape_us_per_msg"},
        {"shape+hop", "floor.hop_us_per_msg"},
        {"Redis client", "redis.paced_client_us_per_eval"}}},
      {"worker_us_paced",
       "worker on-CPU per evaluation at " + r + "/s",
       "workers.paced_us_per_eval",
       none(),
       none(),
       {{"net of idle", "workers.paced_us_net"},
        {"echo process", "floor.hop_echo_us_per_msg"},
        {"echo, two pipes", "floor.hop_pipes_echo_us_per_msg"},
        {"redis-server", "redis.paced_server_us_per_eval"}}},
      {"wakeups_paced",
       "wake-ups per evaluation at " + r + "/s (host threads)",
       "host.paced_wakeups_per_eval",
       none(),
       none(),
       {{"workers", "workers.paced_wakeups_per_eval"},
        {"InProcess", "inproc.paced_wakeups_per_eval"},
        {"pacing alone", "floor.pacing_wakeups_per_msg"},
        {"bare shape", "floor.shape_wakeups_per_msg"},
        {"shape+hop", "floor.hop_wakeups_per_msg"},
        {"its echo", "floor.hop_echo_wakeups_per_msg"},
        {"echo, two pipes", "floor.hop_pipes_echo_wakeups_per_msg"},
        {"Redis client", "redis.paced_client_wakeups_per_eval"},
        {"redis-server", "redis.paced_server_wakeups_per_eval"}}},
      {"idle_p50",
       "added latency p50, idle",
       "host.idle_p50_us",
       at_most(150, "≤ 150 µs"),
       at_most_and_other(1e300, "redis.single_p50_us", 1.0, "≤ Redis EVALSHA single-client p50"),
       {{"evaluate_sync", "host.idle_sync_p50_us"},
        {"InProcess", "inproc.idle_p50_us"},
        {"pipe", "pipe.rt_p50_us"},
        {"Redis", "redis.single_p50_us"}}},
      {"idle_p99",
       "added latency p99, idle",
       "host.idle_p99_us",
       none(),
       none(),
       {{"evaluate_sync", "host.idle_sync_p99_us"},
        {"InProcess", "inproc.idle_p99_us"},
        {"pipe", "pipe.rt_p99_us"},
        {"Redis", "redis.single_p99_us"}}},
      {"wakeups_idle",
       "wake-ups per idle round trip (host threads)",
       "host.idle_wakeups_per_eval",
       none(),
       none(),
       {{"evaluate_sync", "host.idle_sync_wakeups_per_eval"},
        {"workers", "workers.idle_wakeups_per_eval"}}},
      {"paced_p50",
       "p50 at " + r + "/s (from intended send time)",
       "host.paced_p50_us",
       none(),
       none(),
       {{"InProcess", "inproc.paced_p50_us"},
        {"shape+hop", "floor.hop_p50_us"},
        {"Redis", "redis.paced_p50_us"}}},
      {"paced_p99",
       "p99 at " + r + "/s",
       "host.paced_p99_us",
       at_most(2000, "≤ 2 ms"),
       at_most_and_other(500, "redis.paced_p99_us", 1.0, "≤ 0.5 ms and ≤ Redis paced p99"),
       {{"InProcess", "inproc.paced_p99_us"},
        {"shape+hop", "floor.hop_p99_us"},
        {"Redis", "redis.paced_p99_us"}}},
      {"paced_p999",
       "p99.9 at " + r + "/s",
       "host.paced_p999_us",
       none(),
       none(),
       {{"InProcess", "inproc.paced_p999_us"},
        {"shape+hop", "floor.hop_p999_us"},
        {"Redis", "redis.paced_p999_us"}}},
      {"closed_loop",
       "closed loop, every result checked",
       "host.closed_per_s",
       at_least(5000, "≥ 5k/s"),
       at_least_and_other(1e6, "redis.pipelined_per_s", 1.3, "≥ 1 M/s and ≥ 1.3× Redis pipelined"),
       {{"InProcess", "inproc.closed_per_s"}, {"Redis pipelined", "redis.pipelined_per_s"}}},
      {"log_script",
       "workers on-CPU per evaluation, closed loop, a script that prints each time",
       "logs.print_workers_us_per_eval",
       none(),
       none(),
       {{"same, no print", "logs.plain_workers_us_per_eval"},
        {"host", "logs.print_host_us_per_eval"},
        {"host, no print", "logs.plain_host_us_per_eval"}}},
      {"rss_idle",
       "worker RSS, idle",
       "worker.rss_idle_mb",
       at_most(80, "≤ 80 MB"),
       at_most(8, "≤ 8 MB"),
       {}},
      {"rss_scripts",
       "worker RSS after compiling " + n + " scripts",
       "scripts.rss_mb",
       at_most(80, "≤ 80 MB"),
       at_most(24, "≤ 24 MB"),
       {{"the other worker", "scripts.rss_other_mb"}}},
      {"kill_latency",
       "kill latency after T+G (max of rounds)",
       "kill.after_tg_max_ms",
       at_most(100, "≤ 100 ms"),
       at_most(10, "≤ 10 ms"),
       {{"p50", "kill.after_tg_p50_ms"}}},
      {"warm_restart",
       "warm restart, " + n + " cached scripts (kill 1 shard)",
       "scripts.warm_restart_ms",
       at_most(2000, "≤ 2 s"),
       at_most(100, "≤ 100 ms"),
       {{"death seen + spawn", "scripts.warm_restart_spawn_ms"},
        {"then re-send, compile, run", "scripts.warm_restart_run_ms"},
        {"compiles", "scripts.warm_restart_compiles_count"},
        {"InProcess: same scripts, register + first run", "scripts.inproc_cold_ms"},
        {"cold first run of all", "scripts.cold_ms"}}},
      {"kill_all",
       "kill both shards → every script's next result",
       "scripts.kill_all_ms",
       at_most(2000, "≤ 2 s"),
       at_most(200, "≤ 200 ms"),
       {{"scripts", "scripts.kill_all_count"}}},
      {"shard_kill",
       "kill one shard → its next ok (1 script), p50",
       "kill.shard_next_ok_p50_ms",
       none(),
       none(),
       {{"max", "kill.shard_next_ok_max_ms"}}},
      {"idle_cpu",
       "idle CPU, host (% of a core)",
       "host.idle_cpu_pct",
       none(),
       none(),
       {{"all workers", "workers.idle_cpu_pct"}}},
      {"tags_p99",
       "tags: source update → change callback p99, 1,000 tags 3 deep, " + r + " updates/s",
       "tags.p99_us",
       none(),
       at_most_and_other(1e300, "host.paced_p99_us", 1.2 * 3,
                         "≤ 1.2× raw evaluate p99 per level (3 levels)"),
       {{"p50", "tags.p50_us"},
        {"raw evaluate p99", "host.paced_p99_us"},
        {"keep_state", "tags.keep_state_p99_us"},
        {"InProcess", "tags.inproc_p99_us"}}},
      {"tags_us",
       "tags: host on-CPU per source update (4 evaluations)",
       "tags.host_us_per_update",
       none(),
       none(),
       {{"raw evaluate, per evaluation", "host.paced_us_per_eval"},
        {"evaluations per update", "tags.evals_per_update"},
        {"keep_state", "tags.keep_state_host_us_per_update"},
        {"workers", "tags.workers_us_per_update"},
        {"InProcess", "tags.inproc_host_us_per_update"}}},
      // outrund against redis-server, each through the harness's raw client (daemon_peer.h,
      // redis_peer.h), the same script, one Unix socket per client.
      {"daemon_p50",
       "outrund, 1 client, one at a time (raw frames), p50",
       "daemon.single_p50_us",
       none(),
       at_most_and_other(1e300, "redis.single_p50_us", 1.5, "≤ 1.5× redis-server p50"),
       {{"redis-server (raw RESP)", "redis.single_p50_us"},
        {"outrund via outrun::Client", "daemon.client_p50_us"},
        {"in-process Host", "host.idle_p50_us"}}},
      {"daemon_p99",
       "outrund, 1 client, one at a time (raw frames), p99",
       "daemon.single_p99_us",
       none(),
       none(),
       {{"redis-server (raw RESP)", "redis.single_p99_us"},
        {"outrund via outrun::Client", "daemon.client_p99_us"}}},
      {"daemon_pipelined",
       "outrund pipelined, " + cd + ", every answer checked",
       "daemon.pipelined_per_s",
       none(),
       at_least_and_other(0, "redis.pipelined_per_s", 1.0, "≥ redis-server pipelined"),
       {{"redis-server", "redis.pipelined_per_s"},
        {"client CPU per evaluation", "daemon.pipelined_client_us_per_eval"},
        {"Redis client", "redis.pipelined_client_us_per_eval"}}},
      {"daemon_us_pipelined",
       "outrund + workers on-CPU per evaluation, pipelined",
       "daemon.pipelined_us_per_eval",
       none(),
       at_most_and_other(1e300, "redis.pipelined_server_us_per_eval", 1.0, "≤ redis-server's"),
       {{"outrund", "daemon.pipelined_daemon_us_per_eval"},
        {"workers", "daemon.pipelined_workers_us_per_eval"},
        {"redis-server", "redis.pipelined_server_us_per_eval"}}},
      {"daemon_us_single",
       "outrund + workers on-CPU per evaluation, 1 client",
       "daemon.single_us_per_eval",
       none(),
       none(),
       {{"outrund", "daemon.single_daemon_us_per_eval"},
        {"workers", "daemon.single_workers_us_per_eval"},
        {"redis-server", "redis.single_server_us_per_eval"}}},
      {"daemon_switches_single",
       "outrund threads' context switches per evaluation, 1 client (vol. + invol.)",
       "daemon.single_daemon_switches_per_eval",
       none(),
       none(),
       {{"voluntary", "daemon.single_daemon_wakeups_per_eval"},
        {"workers", "daemon.single_workers_switches_per_eval"},
        {"workers voluntary", "daemon.single_workers_wakeups_per_eval"},
        {"redis-server", "redis.single_server_switches_per_eval"}}},
      {"daemon_switches_pipelined",
       "outrund threads' context switches per evaluation, pipelined (vol. + invol.)",
       "daemon.pipelined_daemon_switches_per_eval",
       none(),
       none(),
       {{"voluntary", "daemon.pipelined_daemon_wakeups_per_eval"},
        {"workers", "daemon.pipelined_workers_switches_per_eval"},
        {"workers voluntary", "daemon.pipelined_workers_wakeups_per_eval"},
        {"redis-server", "redis.pipelined_server_switches_per_eval"}}},
      {"wrong",
       "wrong or missing results",
       "all.wrong",
       none(),
       at_most(0, "0"),
       {{"checked", "all.checked"}}},
  };
  // Before the last row ("wrong"): one set of scale rows per N.
  for (int total : scale) {
    std::vector<RowDef> more = scale_rows(rate, total);
    rows.insert(rows.end() - 1, more.begin(), more.end());
  }
  return rows;
}

std::vector<RowResult> evaluate_rows(const std::vector<RowDef>& defs, const Arm& arm) {
  std::vector<RowResult> out;
  const auto m = [&](const std::string& id) { return arm.median(id); };
  for (const RowDef& d : defs) {
    RowResult r;
    r.def = &d;
    auto it = arm.agg.find(d.figure);
    if (it != arm.agg.end()) {
      r.present = true;
      r.median = it->second.median;
      r.min = it->second.min;
      r.max = it->second.max;
      r.samples = static_cast<int>(it->second.samples.size());
      if (d.seed.judge) r.seed = d.seed.judge(r.median, m);
      if (d.goal.judge) r.goal = d.goal.judge(r.median, m);
    }
    for (const auto& [label, id] : d.beside)
      if (auto v = arm.median(id)) r.beside.emplace_back(label, format_value(*v, figure_unit(id)));
    out.push_back(std::move(r));
  }
  return out;
}

std::string text_table(const std::vector<RowResult>& rows, bool show_range) {
  std::vector<std::array<std::string, 7>> cells;
  cells.push_back({"row", "seed budget", "outrun goal", "measured", "seed", "goal", "same run"});
  for (const RowResult& r : rows) {
    if (!r.present) continue;
    cells.push_back({r.def->label, r.def->seed.text, r.def->goal.text, measured_cell(r, show_range),
                     verdict_text(r.seed), verdict_text(r.goal), beside_cell(r, " · ")});
  }
  std::array<std::size_t, 7> w{};
  for (const auto& row : cells)
    for (std::size_t c = 0; c < 6; ++c) w[c] = std::max(w[c], width(row[c]));
  std::ostringstream out;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    for (std::size_t c = 0; c < 6; ++c) out << pad(cells[i][c], w[c]) << "  ";
    out << cells[i][6] << "\n";
    if (i == 0) {
      std::size_t total = 0;
      for (std::size_t c = 0; c < 6; ++c) total += w[c] + 2;
      out << std::string(total + 8, '-') << "\n";
    }
  }
  return out.str();
}

std::string markdown_table(const std::vector<RowResult>& rows, bool show_range) {
  std::ostringstream out;
  out << "| row | seed budget | outrun goal | measured | seed | goal | same run "
         "|\n|---|---|---|---|---|---|---|\n";
  for (const RowResult& r : rows) {
    if (!r.present) continue;
    const bool judged = r.goal != Verdict::none;
    out << "| " << r.def->label << " | " << r.def->seed.text << " | " << r.def->goal.text << " | "
        << (judged ? "**" : "") << measured_cell(r, show_range) << (judged ? "**" : "") << " | "
        << verdict_text(r.seed) << " | " << verdict_text(r.goal) << " | " << beside_cell(r, " · ")
        << " |\n";
  }
  return out.str();
}

nlohmann::json rows_json(const std::vector<RowResult>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const RowResult& r : rows) {
    if (!r.present) continue;
    nlohmann::json beside = nlohmann::json::object();
    for (const auto& [label, value] : r.beside) beside[label] = value;
    j.push_back({{"id", r.def->id},
                 {"label", r.def->label},
                 {"figure", r.def->figure},
                 {"unit", figure_unit(r.def->figure)},
                 {"median", r.median},
                 {"min", r.min},
                 {"max", r.max},
                 {"samples", r.samples},
                 {"seed_budget", r.def->seed.text},
                 {"goal", r.def->goal.text},
                 {"seed_verdict", verdict_text(r.seed)},
                 {"goal_verdict", verdict_text(r.goal)},
                 {"same_run", beside}});
  }
  return j;
}

nlohmann::json arm_json(const Arm& arm) {
  nlohmann::json figs = nlohmann::json::object();
  for (const auto& [id, a] : arm.agg)
    figs[id] = {{"unit", figure_unit(id)},
                {"median", a.median},
                {"min", a.min},
                {"max", a.max},
                {"samples", a.samples}};
  return {{"name", arm.name}, {"spec", arm.spec}, {"figures", figs}};
}

std::string ab_table(const std::vector<RowDef>& defs, const Arm& a, const Arm& b, bool markdown) {
  std::ostringstream out;
  std::vector<std::array<std::string, 4>> cells;
  cells.push_back({"row", "A: " + a.spec, "B: " + b.spec, "B/A"});
  for (const RowDef& d : defs) {
    auto va = a.median(d.figure), vb = b.median(d.figure);
    if (!va || !vb) continue;
    const std::string unit = figure_unit(d.figure);
    char ratio[32] = "—";
    if (*va != 0) std::snprintf(ratio, sizeof ratio, "%.3f", *vb / *va);
    cells.push_back({d.label, format_value(*va, unit), format_value(*vb, unit), ratio});
  }
  if (markdown) {
    for (std::size_t i = 0; i < cells.size(); ++i) {
      out << "| " << cells[i][0] << " | " << cells[i][1] << " | " << cells[i][2] << " | "
          << cells[i][3] << " |\n";
      if (i == 0) out << "|---|---|---|---|\n";
    }
    return out.str();
  }
  std::array<std::size_t, 4> w{};
  for (const auto& row : cells)
    for (std::size_t c = 0; c < 4; ++c) w[c] = std::max(w[c], width(row[c]));
  for (const auto& row : cells) {
    for (std::size_t c = 0; c < 3; ++c) out << pad(row[c], w[c]) << "  ";
    out << row[3] << "\n";
  }
  return out.str();
}

nlohmann::json ab_json(const std::vector<RowDef>& defs, const Arm& a, const Arm& b) {
  nlohmann::json j = nlohmann::json::array();
  for (const RowDef& d : defs) {
    auto va = a.median(d.figure), vb = b.median(d.figure);
    if (!va || !vb) continue;
    j.push_back(
        {{"id", d.id},
         {"figure", d.figure},
         {"a", *va},
         {"b", *vb},
         {"ratio_b_over_a", *va != 0 ? nlohmann::json(*vb / *va) : nlohmann::json(nullptr)}});
  }
  return j;
}

}  // namespace outrun::perf
