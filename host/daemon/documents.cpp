// The JSON documents of the Control replies (design/daemon.md "Documents (Control replies)"):
// Stats, Shards, and the pages of ListScripts.
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "conn.h"
#include "script_pages.h"
#include "server.h"

namespace outrun::daemon {

namespace {
// Script keys come from clients and may be any bytes; dump() throws on invalid UTF-8, which on
// the loop thread would end the daemon. Invalid sequences become U+FFFD.
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json latency_json(const LatencyHistogram& h) {
  return nlohmann::json{
      {"count", h.count()},      {"p50", h.quantile(0.5)},    {"p90", h.quantile(0.9)},
      {"p99", h.quantile(0.99)}, {"p999", h.quantile(0.999)}, {"max", h.max()},
      {"sum", h.sum()}};
}
}  // namespace

namespace {
// Stats registry.quota: the per-uid limits and what each uid that holds a record is charged.
nlohmann::json quota_json(const RegistryQuota& q) {
  nlohmann::json uids = nlohmann::json::object();
  for (const auto& [uid, u] : q.uids())
    uids[std::to_string(uid)] = {{"scripts", u.scripts}, {"bytes", u.bytes}};
  return {{"bytes_per_uid", q.max_bytes()}, {"scripts_per_uid", q.max_scripts()}, {"uids", uids}};
}
}  // namespace

namespace {
std::string hex(const std::array<uint8_t, 32>& h) {
  static const char* d = "0123456789abcdef";
  std::string s(64, '0');
  for (int i = 0; i < 32; ++i) {
    s[2 * i] = d[h[i] >> 4];
    s[2 * i + 1] = d[h[i] & 15];
  }
  return s;
}
}  // namespace

std::string Server::stats_json(bool shards_only) const {
  using nlohmann::json;
  json shards = json::array();
  uint64_t queued = 0;
  for (int i = 0; i < host_->shards(); ++i) {
    const ShardStats s = host_->shard_stats(i);
    json window;
    {
      const Scheduler::WindowStats w = sched_->window(i);
      window = json{{"size", w.size},
                    {"used", w.used},
                    {"service_us", static_cast<uint64_t>(w.service_us)},
                    {"queued", w.queued},
                    {"clients", w.clients}};
      queued += w.queued;
    }
    shards.push_back(
        json{{"index", s.index},
             {"slow_lane", s.slow_lane},
             {"state", s.state},
             {"pid", s.pid},
             {"uptime_s", s.uptime_ms < 0 ? -1.0 : static_cast<double>(s.uptime_ms) / 1000.0},
             {"starts", s.starts},
             {"restarts", s.starts > 0 ? s.starts - 1 : 0},
             {"deaths", s.deaths},
             {"death_causes",
              {{"killed_overrun", s.killed_overrun},
               {"killed_silence", s.killed_silence},
               {"killed_requested", s.killed_requested},
               {"crashed", s.crashed},
               {"exited", s.exited},
               {"protocol_violation", s.protocol_violations}}},
             {"crashes_charged", s.crashes_charged},
             {"quarantine_refusals", s.quarantine_refusals},
             {"last_death", s.last_death},
             {"evaluations", s.evaluations},
             {"retried", s.retried},
             {"worker_evaluations", s.worker_evaluations},
             {"worker_compiles", s.worker_compiles},
             {"worker_scripts", s.worker_scripts},
             {"worker_script_bytes", s.worker_script_bytes},
             {"worker_evictions", s.worker_evictions},
             {"rss_bytes", s.worker_rss_bytes},
             {"peak_rss_bytes", s.worker_peak_rss_bytes},
             {"heartbeat_age_ms", s.heartbeat_age_ms},
             {"latency_us", latency_json(counters_.shard_latency[i])},
             {"window", std::move(window)}});
  }
  if (shards_only) return dump(json{{"shards", shards}});
  json by_status = json::object();
  for (int i = 0; i < kStatusCount; ++i)
    by_status[std::string(to_string(static_cast<Status>(i)))] =
        counters_.by_status[i].load(std::memory_order_relaxed);
  const auto& h = counters_.latency;
  uint64_t held = 0, max_queued = 0;
  for (const auto& [p, c] : conns_) {
    held += c->held.load(std::memory_order_relaxed) ? 1 : 0;
    max_queued = std::max<uint64_t>(max_queued, c->writer.queued_bytes());
  }
  const RegistryStats reg = host_->registry_stats();
  const CompilerStats comp = host_->compiler_stats();
  const CrashBudget::Stats cb = crash_budget_.stats(std::chrono::steady_clock::now());
  const CrashBudget::Limits& cl = crash_budget_.limits();
  uint64_t lane_queued = 0;
  for (int i = 0; i < host_->shards(); ++i) lane_queued += sched_->window(i).lane_queued;
  const SlowLaneStats lane = host_->slow_lane_stats();
  json j{
      {"version", OUTRUN_VERSION},
      {"pid", getpid()},
      {"uptime_s",
       std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count()},
      {"clients", conns_.size()},
      {"clients_total", clients_total_},
      {"clients_refused", clients_refused_ + acceptor_.refused()},
      {"client_protocol_violations", violations_},
      {"inflight", counters_.inflight.load(std::memory_order_relaxed)},
      {"queued", queued},
      {"clients_held", held},
      {"clients_held_total", sched_->held_total()},
      {"clients_over_limit", over_limit_.load(std::memory_order_relaxed)},
      {"heap_collects", trims_},
      {"client_queued_bytes",
       {{"max", max_queued},
        {"peak", sched_->queued_peak_bytes()},
        {"budget", cfg_.max_client_queued_bytes},
        {"limit", kHardLimitFactor * cfg_.max_client_queued_bytes}}},
      {"scripts", scripts_.live()},
      {"registry",
       {{"scripts", reg.scripts}, {"bytes", reg.bytes}, {"quota", quota_json(scripts_.quota())}}},
      {"compiler",
       {{"pid", comp.pid},
        {"compiled", comp.compiled},
        {"refused", comp.refused},
        {"restarts", comp.restarts},
        {"kills", comp.kills},
        {"bytecode_bytes", comp.cached_bytes},
        {"idle", comp.idle}}},
      {"crash_budget",
       {{"max_crashes_per_uid", cl.max_crashes},
        {"crash_window_ms", cl.window.count()},
        {"crash_cooldown_ms", cl.cooldown.count()},
        {"crashes_charged", cb.charged},
        {"cooldowns", cb.cooldowns},
        {"refusals", cb.refusals},
        {"uids_in_cooldown", cb.uids_in_cooldown},
        {"host_log_lines_suppressed", host_log_limit_->suppressed_total()}}},
      {"tags_lane_queued", lane_queued},
      {"evaluations", by_status},
      {"latency_us", latency_json(h)},
      {"slow_lane",
       {{"shard", lane.shard},
        {"scripts", lane.scripts},
        {"moves_in", lane.moves_in},
        {"moves_out", lane.moves_out},
        {"evaluations", lane.evaluations},
        {"refused_full", lane.refused_full}}},
      {"shards", shards}};
  if (tags_.running()) {
    tags::Engine& engine = tags_.engine();
    // The tags engine's own counters. Its evaluations also count in "evaluations" by status,
    // where an alert on timeouts looks ("tags" keeps them apart too).
    const tags::EngineCounters tc = engine.counters();
    json tag_status = json::object();
    for (int i = 0; i < kStatusCount; ++i) {
      const std::string name(to_string(static_cast<Status>(i)));
      tag_status[name] = tc.by_status[i];
      j["evaluations"][name] = j["evaluations"][name].get<uint64_t>() + tc.by_status[i];
    }
    j["tags"] = {{"tags", engine.size()},
                 {"waves", tc.waves},
                 {"waves_waiting", tc.waves_waiting},
                 {"last_wave_us", tc.last_wave.count()},
                 {"source_updates", tc.source_updates},
                 {"evaluations", tc.evaluations},
                 {"by_status", std::move(tag_status)},
                 {"changes", tc.changes},
                 {"coalesced", tc.coalesced},
                 {"overflows", tc.overflows},
                 {"skipped_bad", tc.skipped_bad},
                 {"busy", tc.busy}};
    // metrics_per_tag_series: each tag's own counters, for at most that many tags (the first
    // in `outrun tags list` order, cut sooner past 64 MiB of values), and how many were left out.
    if (const std::size_t limit = cfg_.metrics_per_tag_series; limit > 0) {
      std::vector<tags::TagInfo> page;
      bool more = false;
      json per_tag = json::array();
      if (!engine.page("", limit, std::size_t{64} << 20, &page, &more))
        for (const tags::TagInfo& t : page) {
          json by = json::object();
          for (int i = 0; i < kStatusCount; ++i)
            if (t.counters.by_status[i] != 0)
              by[std::string(to_string(static_cast<Status>(i)))] = t.counters.by_status[i];
          per_tag.push_back({{"id", t.definition.id},
                             {"evaluations", t.counters.evaluations},
                             {"by_status", std::move(by)},
                             {"last_duration_us", t.counters.last_duration.count()}});
        }
      const std::size_t total = engine.size();
      j["tags"]["per_tag_omitted"] = total > per_tag.size() ? total - per_tag.size() : 0;
      j["tags"]["per_tag"] = std::move(per_tag);
    }
  }
  {
    // SIGHUPs seen, and the last finished reload: which of them it covered, its result.
    TagsService::ReloadStats r = tags_.reload_stats();
    j["reload"] = {{"requested", r.requested},
                   {"covered", r.covered},
                   {"ok", r.ok},
                   {"errors", std::move(r.errors)}};
  }
  return dump(j);
}

Error Server::scripts_json(std::string_view after, uint32_t limit, std::string* out) const {
  PageCursor at;
  if (!decode_cursor(after, &at))
    return {ErrorCode::invalid_argument,
            "ListScripts: 'after' is not a cursor of this daemon (send the \"next\" of the "
            "previous page, or nothing for the first page)"};
  if (limit == 0) limit = kDefaultPageScripts;
  limit = std::min(limit, kMaxPageScripts);
  using nlohmann::json;
  // Room for the tail: ],"total":N,"next":"<cursor of up to 2 * 256 + 11 bytes>"}.
  constexpr std::size_t kTail = 1024;
  std::string& doc = *out;
  doc = "{\"scripts\":[";
  uint32_t n = 0;
  std::optional<std::string> next;
  const ScriptTable::Keys& keys = scripts_.keys();
  auto it = at.key.empty() ? keys.begin() : keys.lower_bound(at.key);
  uint32_t skip = it != keys.end() && it->first == at.key ? at.skip : 0;
  for (; it != keys.end() && !next; ++it, skip = 0) {
    const std::vector<uint32_t>& ids = it->second;
    for (std::size_t i = skip; i < ids.size(); ++i) {
      const ScriptEntry& e = *scripts_.at(ids[i]);
      if (n == limit) {
        next = encode_cursor(it->first, static_cast<uint32_t>(i));
        break;
      }
      json by_status = json::object();
      uint64_t total = 0;
      for (int s = 0; s < kStatusCount; ++s) {
        const uint64_t k = e.by_status[s].load(std::memory_order_relaxed);
        total += k;
        if (k) by_status[std::string(to_string(static_cast<Status>(s)))] = k;
      }
      const ScriptCrashStats crashes = host_->script_crashes(e.script);
      const std::string item = dump(json{{"handle", ScriptTable::handle_of(e)},
                                         {"key", e.script.key()},
                                         {"sha256", hex(e.script.sha256())},
                                         {"shard", e.script.shard()},
                                         {"evaluations", total},
                                         {"by_status", by_status},
                                         {"crashes", crashes.crashes},
                                         {"quarantined", crashes.quarantined},
                                         {"slow_lane", crashes.slow_lane}});
      if (n > 0 && doc.size() + 1 + item.size() + kTail > kMaxPageBytes) {
        next = encode_cursor(it->first, static_cast<uint32_t>(i));
        break;
      }
      if (n > 0) doc += ',';
      doc += item;
      ++n;
    }
  }
  doc += "],\"total\":" + std::to_string(scripts_.live()) + ",\"next\":";
  doc += next ? "\"" + *next + "\"}" : "null}";
  return {};
}

}  // namespace outrun::daemon
