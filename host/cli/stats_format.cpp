#include "stats_format.h"

#include <array>
#include <cstdio>
#include <sstream>

#include "json_values.h"

namespace outrun::cli {

namespace {

std::string num(const nlohmann::json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number()) {
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", v.get<double>());
    return b;
  }
  if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
  return "NaN";
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

struct Prom {
  std::ostringstream os;
  void family(const char* name, const char* type, const char* help) {
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void sample(const std::string& name, const std::string& labels, const nlohmann::json& v) {
    os << name;
    if (!labels.empty()) os << "{" << labels << "}";
    os << " " << num(v) << "\n";
  }
};

std::string shard_label(const nlohmann::json& s) {
  return "shard=\"" + std::to_string(s.value("index", 0)) + "\"";
}

}  // namespace

std::string stats_prometheus(const nlohmann::json& j) {
  Prom p;
  p.family("outrun_up", "gauge", "1 while outrund answers.");
  p.sample("outrun_up", "", 1);
  p.family("outrun_uptime_seconds", "gauge", "Seconds since outrund started.");
  p.sample("outrun_uptime_seconds", "", j.value("uptime_s", 0.0));
  p.family("outrun_clients", "gauge", "Clients connected now.");
  p.sample("outrun_clients", "", j.value("clients", 0));
  p.family("outrun_clients_total", "counter", "Clients accepted since start.");
  p.sample("outrun_clients_total", "", j.value("clients_total", 0));
  p.family("outrun_clients_refused_total", "counter",
           "Connections refused (credentials, max_clients).");
  p.sample("outrun_clients_refused_total", "", j.value("clients_refused", 0));
  p.family("outrun_client_protocol_violations_total", "counter",
           "Clients disconnected for bad frames.");
  p.sample("outrun_client_protocol_violations_total", "", j.value("client_protocol_violations", 0));
  p.family("outrun_inflight", "gauge", "Evaluations in flight.");
  p.sample("outrun_inflight", "", j.value("inflight", 0));
  p.family("outrun_scripts", "gauge", "Registered scripts.");
  p.sample("outrun_scripts", "", j.value("scripts", 0));
  p.family("outrun_evaluations_total", "counter",
           "Evaluations answered, by status: clients' and tags' (outrun_tag_evaluations_total).");
  if (j.contains("evaluations"))
    for (auto it = j["evaluations"].begin(); it != j["evaluations"].end(); ++it)
      p.sample("outrun_evaluations_total", "status=\"" + esc(it.key()) + "\"", it.value());
  if (j.contains("tags") && j["tags"].is_object()) {
    const auto& t = j["tags"];
    p.family("outrun_tag_evaluations_total", "counter", "Tag evaluations, by status.");
    if (t.contains("by_status") && t["by_status"].is_object())
      for (auto it = t["by_status"].begin(); it != t["by_status"].end(); ++it)
        p.sample("outrun_tag_evaluations_total", "status=\"" + esc(it.key()) + "\"", it.value());
    static constexpr std::array<std::array<const char*, 4>, 9> kTagNumbers{{
        {"outrun_tags", "gauge", "Virtual tags defined.", "tags"},
        {"outrun_tag_waves_total", "counter", "Waves run.", "waves"},
        {"outrun_tag_waves_waiting", "gauge", "Waves running or due now (the queue).",
         "waves_waiting"},
        {"outrun_tag_source_updates_total", "counter", "Source updates received.",
         "source_updates"},
        {"outrun_tag_changes_total", "counter", "Tag values that changed (notified).", "changes"},
        {"outrun_tag_coalesced_total", "counter",
         "Triggers merged into a later evaluation (coalesced updates).", "coalesced"},
        {"outrun_tag_overflows_total", "counter",
         "Values published with the Overflow bit (updates merged or dropped).", "overflows"},
        {"outrun_tag_skipped_bad_total", "counter",
         "Triggers not evaluated because an input was Bad.", "skipped_bad"},
        {"outrun_tag_busy_total", "counter", "Tag evaluations refused by single flight.", "busy"},
    }};
    for (const auto& [name, type, help, key] : kTagNumbers) {
      p.family(name, type, help);
      p.sample(name, "", t.value(key, 0));
    }
    p.family("outrun_tag_last_wave_seconds", "gauge", "Duration of the last wave that ended.");
    p.sample("outrun_tag_last_wave_seconds", "", t.value("last_wave_us", 0) / 1e6);
    // outrund's metrics_per_tag_series: families of their own, so that a sum over
    // outrun_tag_evaluations_total still counts each evaluation once.
    if (t.contains("per_tag") && t["per_tag"].is_array()) {
      const auto& per = t["per_tag"];
      p.family("outrun_tag_evaluations_by_tag_total", "counter",
               "Evaluations of one tag, by status (metrics_per_tag_series tags only).");
      for (const auto& x : per)
        if (x.contains("by_status") && x["by_status"].is_object())
          for (auto it = x["by_status"].begin(); it != x["by_status"].end(); ++it)
            p.sample("outrun_tag_evaluations_by_tag_total",
                     "tag=\"" + esc(x.value("id", "")) + "\",status=\"" + esc(it.key()) + "\"",
                     it.value());
      p.family("outrun_tag_last_duration_seconds", "gauge",
               "Submit to result of one tag's last evaluation (metrics_per_tag_series tags only).");
      for (const auto& x : per)
        p.sample("outrun_tag_last_duration_seconds", "tag=\"" + esc(x.value("id", "")) + "\"",
                 x.value("last_duration_us", 0) / 1e6);
      p.family("outrun_tag_series_omitted", "gauge",
               "Tags left without per-tag series (past metrics_per_tag_series).");
      p.sample("outrun_tag_series_omitted", "", t.value("per_tag_omitted", 0));
    }
  }
  if (j.contains("latency_us")) {
    const auto& l = j["latency_us"];
    p.family("outrun_evaluation_latency_seconds", "summary",
             "Time from the daemon reading an evaluation to its result (upper bucket edges).");
    for (auto [q, k] :
         {std::pair{"0.5", "p50"}, {"0.9", "p90"}, {"0.99", "p99"}, {"0.999", "p999"}})
      p.sample("outrun_evaluation_latency_seconds", std::string("quantile=\"") + q + "\"",
               l.value(k, 0) / 1e6);
    p.sample("outrun_evaluation_latency_seconds_sum", "", l.value("sum", 0) / 1e6);
    p.sample("outrun_evaluation_latency_seconds_count", "", l.value("count", 0));
  }
  if (j.contains("shards")) {
    const auto& sh = j["shards"];
    p.family("outrun_shard_up", "gauge", "1 when the shard's worker is running.");
    for (const auto& s : sh)
      p.sample("outrun_shard_up", shard_label(s), s.value("state", "") == "running" ? 1 : 0);
    // One number per shard, straight from the shards document (`missing`: its value when the
    // document lacks the key).
    struct ShardNumber {
      const char* name;
      const char* type;
      const char* help;
      const char* key;
      int missing;
    };
    static constexpr ShardNumber kShardNumbers[] = {
        {"outrun_shard_pid", "gauge", "Pid of the shard's worker (0 while down).", "pid", 0},
        {"outrun_shard_uptime_seconds", "gauge",
         "Seconds since the shard's worker started (-1 while down).", "uptime_s", -1},
        {"outrun_shard_restarts_total", "counter", "Worker restarts of the shard.", "restarts", 0},
        {"outrun_shard_evaluations_total", "counter", "Evaluations submitted to the shard.",
         "evaluations", 0},
        {"outrun_shard_retried_total", "counter", "Evaluations sent again after their worker died.",
         "retried", 0},
        {"outrun_shard_rss_bytes", "gauge", "Resident set of the shard's worker.", "rss_bytes", 0},
        {"outrun_shard_peak_rss_bytes", "gauge", "Peak resident set of the shard's current worker.",
         "peak_rss_bytes", 0},
    };
    for (const ShardNumber& m : kShardNumbers) {
      p.family(m.name, m.type, m.help);
      for (const auto& s : sh)
        p.sample(m.name, shard_label(s), s.contains(m.key) ? s[m.key] : nlohmann::json(m.missing));
    }
    p.family("outrun_shard_deaths_total", "counter", "Worker deaths of the shard, by cause.");
    for (const auto& s : sh)
      if (s.contains("death_causes"))
        for (auto it = s["death_causes"].begin(); it != s["death_causes"].end(); ++it)
          p.sample("outrun_shard_deaths_total", shard_label(s) + ",cause=\"" + esc(it.key()) + "\"",
                   it.value());
    p.family("outrun_shard_evaluation_latency_seconds", "summary",
             "Round trip in the daemon of the evaluations this shard ran (upper bucket edges).");
    for (const auto& s : sh) {
      if (!s.contains("latency_us")) continue;
      const auto& l = s["latency_us"];
      for (auto [q, k] :
           {std::pair{"0.5", "p50"}, {"0.9", "p90"}, {"0.99", "p99"}, {"0.999", "p999"}})
        p.sample("outrun_shard_evaluation_latency_seconds",
                 shard_label(s) + ",quantile=\"" + q + "\"", l.value(k, 0) / 1e6);
      p.sample("outrun_shard_evaluation_latency_seconds_sum", shard_label(s),
               l.value("sum", 0) / 1e6);
      p.sample("outrun_shard_evaluation_latency_seconds_count", shard_label(s),
               l.value("count", 0));
    }
    p.family("outrun_shard_heartbeat_age_seconds", "gauge",
             "Age of the worker's last heartbeat (-1 while down).");
    for (const auto& s : sh) {
      const int64_t a = s.value("heartbeat_age_ms", int64_t{-1});
      p.sample("outrun_shard_heartbeat_age_seconds", shard_label(s),
               a < 0 ? -1.0 : static_cast<double>(a) / 1e3);
    }
  }
  return p.os.str();
}

std::string shards_text(const nlohmann::json& doc) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "%-5s %-10s %-8s %10s %8s %8s %12s %10s %8s %8s  %s\n", "SHARD",
                "STATE", "PID", "UPTIME_S", "RESTARTS", "DEATHS", "EVALUATIONS", "RSS_KB", "P50_US",
                "P99_US", "LAST DEATH");
  os << line;
  if (!doc.contains("shards")) return os.str();
  for (const auto& s : doc["shards"]) {
    const nlohmann::json lat = s.value("latency_us", nlohmann::json::object());
    std::snprintf(
        line, sizeof line, "%-5d %-10s %-8d %10.1f %8llu %8llu %12llu %10llu %8llu %8llu  %s\n",
        s.value("index", 0), s.value("state", "").c_str(), s.value("pid", 0),
        s.value("uptime_s", -1.0), static_cast<unsigned long long>(s.value("restarts", 0ull)),
        static_cast<unsigned long long>(s.value("deaths", 0ull)),
        static_cast<unsigned long long>(s.value("evaluations", 0ull)),
        static_cast<unsigned long long>(s.value("rss_bytes", 0ull) / 1024),
        static_cast<unsigned long long>(lat.value("p50", 0ull)),
        static_cast<unsigned long long>(lat.value("p99", 0ull)), s.value("last_death", "").c_str());
    os << line;
  }
  return os.str();
}

std::string stats_text(const nlohmann::json& j) {
  std::ostringstream os;
  os << "outrund " << j.value("version", "?") << "  pid " << j.value("pid", 0) << "  up "
     << num(j.value("uptime_s", 0.0)) << " s\n";
  os << "clients " << j.value("clients", 0) << " (" << j.value("clients_total", 0) << " total, "
     << j.value("clients_refused", 0) << " refused)  in flight " << j.value("inflight", 0)
     << "  scripts " << j.value("scripts", 0) << "\n";
  os << "evaluations:";
  if (j.contains("evaluations"))
    for (auto it = j["evaluations"].begin(); it != j["evaluations"].end(); ++it)
      if (it.value().get<uint64_t>() > 0)
        os << " " << it.key() << "=" << it.value().get<uint64_t>();
  os << "\n";
  if (j.contains("latency_us")) {
    const auto& l = j["latency_us"];
    os << "latency (us): p50 " << l.value("p50", 0) << "  p90 " << l.value("p90", 0) << "  p99 "
       << l.value("p99", 0) << "  p99.9 " << l.value("p999", 0) << "  max " << l.value("max", 0)
       << "  (" << l.value("count", 0) << " evaluations)\n";
  }
  if (j.contains("tags") && j["tags"].is_object() && j["tags"].value("tags", 0) > 0) {
    const auto& t = j["tags"];
    os << "tags " << t.value("tags", 0) << ": waves " << t.value("waves", 0) << " (waiting "
       << t.value("waves_waiting", 0) << ", last " << t.value("last_wave_us", 0)
       << " us)  evaluations";
    if (t.contains("by_status"))
      for (auto it = t["by_status"].begin(); it != t["by_status"].end(); ++it)
        if (it.value().get<uint64_t>() > 0)
          os << " " << it.key() << "=" << it.value().get<uint64_t>();
    os << "  coalesced " << t.value("coalesced", 0) << "  overflows " << t.value("overflows", 0)
       << "  skipped_bad " << t.value("skipped_bad", 0) << "\n";
  }
  os << shards_text(j);
  return os.str();
}

std::string scripts_text(const nlohmann::json& doc, bool header) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "%-6s %-32s %-16s %-5s %12s  %s\n", "HANDLE", "KEY", "SHA256",
                "SHARD", "EVALUATIONS", "BY STATUS");
  if (header) os << line;
  if (!doc.contains("scripts")) return os.str();
  for (const auto& s : doc["scripts"]) {
    std::string by;
    for (auto it = s["by_status"].begin(); it != s["by_status"].end(); ++it)
      by += (by.empty() ? "" : " ") + it.key() + "=" + it.value().dump();
    std::snprintf(line, sizeof line, "%-6u %-32s %-16s %-5u %12llu  %s\n", s.value("handle", 0u),
                  json_values::escape_control(s.value("key", "")).c_str(),  // keys are any bytes
                  s.value("sha256", "").substr(0, 16).c_str(), s.value("shard", 0u),
                  static_cast<unsigned long long>(s.value("evaluations", 0ull)), by.c_str());
    os << line;
  }
  return os.str();
}

}  // namespace outrun::cli
