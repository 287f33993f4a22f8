#include "config.h"

#include <grp.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

namespace outrun::daemon {

std::string default_socket_path() {
  if (geteuid() == 0) return "/run/outrun/outrund.sock";
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x)
    return std::string(x) + "/outrun/outrund.sock";
  return "/tmp/outrun-" + std::to_string(geteuid()) + "/outrund.sock";
}

std::string default_cache_dir() {
  if (geteuid() == 0) return "/var/cache/outrun";
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/outrun";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/outrun";
  return "/tmp/outrun-cache-" + std::to_string(geteuid());
}

namespace {

struct Reader {
  std::string err;
  std::string section;

  std::string where(std::string_view key) const { return section + "." + std::string(key); }
  // Puts the value's LINE:COL before the error (the file's name goes before that); false.
  bool at(const toml::node& n) {
    const auto& b = n.source().begin;
    err = std::to_string(b.line) + ":" + std::to_string(b.column) + ": " + err;
    return false;
  }

  bool integer(const toml::node& n, std::string_view key, int64_t lo, int64_t hi, int64_t* out) {
    auto v = n.value<int64_t>();
    if (!v || *v < lo || *v > hi) {
      err = where(key) + ": expected an integer in [" + std::to_string(lo) + ", " +
            std::to_string(hi) + "]";
      return false;
    }
    *out = *v;
    return true;
  }
  bool string(const toml::node& n, std::string_view key, std::string* out) {
    auto v = n.value<std::string>();
    if (!v) {
      err = where(key) + ": expected a string";
      return false;
    }
    *out = *v;
    return true;
  }
  bool boolean(const toml::node& n, std::string_view key, bool* out) {
    if (!n.is_boolean()) {
      err = where(key) + ": expected true or false";
      return false;
    }
    *out = n.value<bool>().value_or(false);
    return true;
  }
  bool ms(const toml::node& n, std::string_view key, int64_t lo, std::chrono::milliseconds* out) {
    int64_t v;
    if (!integer(n, key, lo, 86'400'000, &v)) return false;
    *out = std::chrono::milliseconds(v);
    return true;
  }
  bool ids(const toml::node& n, std::string_view key, std::vector<uint32_t>* out) {
    const toml::array* a = n.as_array();
    if (!a) {
      err = where(key) + ": expected an array of integers";
      return false;
    }
    out->clear();
    for (const auto& e : *a) {
      auto v = e.value<int64_t>();
      if (!v || *v < 0 || *v > 0xFFFFFFFELL) {
        err = where(key) + ": expected an array of integers (uids/gids)";
        return false;
      }
      out->push_back(static_cast<uint32_t>(*v));
    }
    return true;
  }
};

bool read_daemon(const toml::table& t, DaemonConfig* c, Reader& r) {
  r.section = "daemon";
  for (auto&& [k, n] : t) {
    const std::string_view key = k.str();
    int64_t v = 0;
    bool ok = true;
    if (key == "socket") {
      ok = r.string(n, key, &c->socket);
    } else if (key == "socket_mode") {
      // An integer (0o660 in TOML) or an octal string ("0660").
      if (auto s = n.value<std::string>()) {
        char* end = nullptr;
        const long m = std::strtol(s->c_str(), &end, 8);
        ok = !s->empty() && *end == 0 && m >= 0 && m <= 0777;
        if (ok)
          c->socket_mode = static_cast<unsigned>(m);
        else
          r.err = "daemon.socket_mode: expected octal permission bits like \"0660\"";
      } else if ((ok = r.integer(n, key, 0, 0777, &v))) {
        c->socket_mode = static_cast<unsigned>(v);
      }
    } else if (key == "allowed_uids") {
      ok = r.ids(n, key, &c->allowed_uids);
      c->uids_set = true;
    } else if (key == "allowed_gids") {
      ok = r.ids(n, key, &c->allowed_gids);
    } else if (key == "socket_group") {
      ok = r.string(n, key, &c->socket_group);
    } else if (key == "admin_uids") {
      ok = r.ids(n, key, &c->admin_uids);
      c->admin_set = true;
    } else if (key == "admin_gids") {
      ok = r.ids(n, key, &c->admin_gids);
      c->admin_set = true;
    } else if (key == "max_clients") {
      if ((ok = r.integer(n, key, 1, 65536, &v))) c->max_clients = static_cast<int>(v);
    } else if (key == "max_pending_hello") {
      if ((ok = r.integer(n, key, 1, 65536, &v))) c->max_pending_hello = static_cast<int>(v);
    } else if (key == "hello_timeout_ms") {
      ok = r.ms(n, key, 1, &c->hello_timeout);
    } else if (key == "max_inflight_per_client") {
      if ((ok = r.integer(n, key, 1, 10'000'000, &v)))
        c->max_inflight_per_client = static_cast<uint32_t>(v);
    } else if (key == "drain_timeout_ms") {
      ok = r.ms(n, key, 0, &c->drain_timeout);
    } else if (key == "log_level") {
      ok = r.string(n, key, &c->log_level);
    } else if (key == "log_file") {
      ok = r.string(n, key, &c->log_file);
    } else if (key == "cache_dir") {
      ok = r.string(n, key, &c->cache_dir);
    } else if (key == "tags_file") {
      ok = r.string(n, key, &c->tags_file);
    } else if (key == "tags_strict") {
      ok = r.boolean(n, key, &c->tags_strict);
    } else if (key == "state_dir") {
      ok = r.string(n, key, &c->state_dir);
    } else if (key == "state_flush_ms") {
      ok = r.ms(n, key, 1, &c->state_flush);
      if (ok && c->state_flush.count() > 60'000) {
        r.err = "daemon.state_flush_ms: expected 1..60000";
        ok = false;
      }
    } else if (key == "max_state_store_bytes") {
      if ((ok = r.integer(n, key, 4096, int64_t{1} << 40, &v)))
        c->max_state_store_bytes = static_cast<std::size_t>(v);
    } else if (key == "max_log_bytes") {
      if ((ok = r.integer(n, key, 65536, int64_t{1} << 34, &v)))
        c->max_log_bytes = static_cast<std::size_t>(v);
    } else if (key == "max_subscriber_bytes") {
      if ((ok = r.integer(n, key, 4096, int64_t{1} << 32, &v)))
        c->max_subscriber_bytes = static_cast<std::size_t>(v);
    } else if (key == "max_tags") {
      if ((ok = r.integer(n, key, 1, int64_t{1} << 20, &v)))
        c->max_tags = static_cast<std::size_t>(v);
    } else if (key == "metrics_per_tag_series") {
      if ((ok = r.integer(n, key, 0, 10'000, &v)))
        c->metrics_per_tag_series = static_cast<std::size_t>(v);
    } else if (key == "max_tags_per_define") {
      if ((ok = r.integer(n, key, 1, int64_t{1} << 20, &v)))
        c->max_tags_per_define = static_cast<std::size_t>(v);
    } else if (key == "max_tag_sources") {
      if ((ok = r.integer(n, key, 1, int64_t{1} << 24, &v)))
        c->max_tag_sources = static_cast<std::size_t>(v);
    } else if (key == "max_tag_source_bytes") {
      if ((ok = r.integer(n, key, 4096, int64_t{1} << 40, &v)))
        c->max_tag_source_bytes = static_cast<std::size_t>(v);
    } else if (key == "max_tag_source_value_bytes") {
      if ((ok = r.integer(n, key, 64, int64_t{16} << 20, &v)))
        c->max_tag_source_value_bytes = static_cast<std::size_t>(v);
    } else if (key == "max_tag_sources_per_uid") {
      if ((ok = r.integer(n, key, 0, int64_t{1} << 24, &v)))
        c->max_tag_sources_per_uid = static_cast<std::size_t>(v);
    } else if (key == "max_tag_source_bytes_per_uid") {
      if ((ok = r.integer(n, key, 4096, int64_t{1} << 40, &v)))
        c->max_tag_source_bytes_per_uid = static_cast<std::size_t>(v);
    } else if (key == "max_subscribed_ids") {
      if ((ok = r.integer(n, key, 1, int64_t{1} << 24, &v)))
        c->max_subscribed_ids = static_cast<std::size_t>(v);
    } else if (key == "max_tag_reads_per_client") {
      if ((ok = r.integer(n, key, 1, 64, &v)))
        c->max_tag_reads_per_client = static_cast<std::size_t>(v);
    } else if (key == "max_read_evaluations") {
      if ((ok = r.integer(n, key, 1, 4096, &v)))
        c->max_read_evaluations = static_cast<std::size_t>(v);
    } else if (key == "max_client_queued_bytes") {
      if ((ok = r.integer(n, key, 4096, int64_t{1} << 40, &v)))
        c->max_client_queued_bytes = static_cast<std::size_t>(v);
    } else if (key == "max_registry_bytes_per_uid") {
      if ((ok = r.integer(n, key, 4096, int64_t{1} << 50, &v)))
        c->max_registry_bytes_per_uid = static_cast<std::size_t>(v);
    } else if (key == "max_registry_scripts_per_uid") {
      if ((ok = r.integer(n, key, 1, int64_t{1} << 22, &v)))
        c->max_registry_scripts_per_uid = static_cast<std::size_t>(v);
    } else if (key == "max_crashes_per_uid") {
      if ((ok = r.integer(n, key, 1, 1'000'000, &v)))
        c->max_crashes_per_uid = static_cast<uint32_t>(v);
    } else if (key == "crash_window_ms") {
      ok = r.ms(n, key, 1, &c->crash_window);
    } else if (key == "crash_cooldown_ms") {
      ok = r.ms(n, key, 1, &c->crash_cooldown);
    } else {
      r.err = "unknown key daemon." + std::string(key);
      ok = false;
    }
    if (!ok) return r.at(n);
  }
  return true;
}

bool read_host(const toml::table& t, DaemonConfig* c, Reader& r) {
  r.section = "host";
  HostOptions* h = &c->host;
  for (auto&& [k, n] : t) {
    const std::string_view key = k.str();
    int64_t v = 0;
    bool ok = true;
    if (key == "shards") {
      if ((ok = r.integer(n, key, 1, 64, &v))) h->shards = static_cast<int>(v);
    } else if (key == "timeout_ms") {
      ok = r.ms(n, key, 1, &h->timeout);
    } else if (key == "grace_ms") {
      ok = r.ms(n, key, 0, &h->grace);
    } else if (key == "memory_limit_mb") {
      if ((ok = r.integer(n, key, 1, 65536, &v)))
        h->memory_limit = static_cast<std::size_t>(v) << 20;
    } else if (key == "worker_script_budget_mb") {
      if ((ok = r.integer(n, key, 1, 1 << 30, &v)))
        h->worker_script_budget = static_cast<std::size_t>(v) << 20;
    } else if (key == "bytecode_cache_mb") {
      if ((ok = r.integer(n, key, 0, 1 << 20, &v)))
        h->bytecode_cache_bytes = static_cast<std::size_t>(v) << 20;
    } else if (key == "worker_address_space_limit_mb") {
      if ((ok = r.integer(n, key, 0, 1 << 30, &v)))
        h->worker_address_space_limit = static_cast<std::size_t>(v) << 20;
    } else if (key == "worker_large_pages") {
      ok = r.boolean(n, key, &h->worker_large_pages);
    } else if (key == "callbacks_on_loop") {
      ok = r.boolean(n, key, &h->callbacks_on_loop);
    } else if (key == "busy_poll_us") {
      if ((ok = r.integer(n, key, 0, 10'000, &v))) h->busy_poll = std::chrono::microseconds(v);
    } else if (key == "worker_path") {
      ok = r.string(n, key, &h->worker_path);
    } else if (key == "start_timeout_ms") {
      ok = r.ms(n, key, 1, &h->start_timeout);
    } else if (key == "shutdown_timeout_ms") {
      ok = r.ms(n, key, 0, &h->shutdown_timeout);
    } else if (key == "max_script_bytes_mb") {
      if ((ok = r.integer(n, key, 1, 1 << 20, &v)))
        h->max_script_bytes = static_cast<std::size_t>(v) << 20;
    } else if (key == "max_queued_while_down") {
      if ((ok = r.integer(n, key, 0, 100'000'000, &v)))
        h->max_queued_while_down = static_cast<std::size_t>(v);
    } else if (key == "restart_delay_ms") {
      ok = r.ms(n, key, 0, &h->restart_delay);
    } else if (key == "heartbeat_interval_ms") {
      ok = r.ms(n, key, 1, &h->heartbeat_interval);
    } else if (key == "silence_limit_ms") {
      ok = r.ms(n, key, 1, &h->silence_limit);
    } else if (key == "single_flight") {
      std::string s;
      if ((ok = r.string(n, key, &s))) {
        if (s == "refuse")
          h->single_flight = SingleFlight::refuse;
        else if (s == "coalesce_latest")
          h->single_flight = SingleFlight::coalesce_latest;
        else if (s == "off")
          h->single_flight = SingleFlight::off;
        else {
          r.err = "host.single_flight: expected \"refuse\", \"coalesce_latest\" or \"off\"";
          ok = false;
        }
      }
    } else if (key == "retries") {
      if ((ok = r.integer(n, key, 0, 100, &v))) h->retries = static_cast<int>(v);
    } else if (key == "crash_loop_limit") {
      if ((ok = r.integer(n, key, 1, 1'000'000, &v))) h->crash_loop_limit = static_cast<int>(v);
    } else if (key == "crash_loop_window_ms") {
      ok = r.ms(n, key, 1, &h->crash_loop_window);
    } else if (key == "crash_loop_cooldown_ms") {
      ok = r.ms(n, key, 0, &h->crash_loop_cooldown);
    } else if (key == "quarantine_after") {
      if ((ok = r.integer(n, key, 1, 1000, &v))) h->quarantine_after = static_cast<int>(v);
    } else if (key == "quarantine_cooldown_ms") {
      ok = r.ms(n, key, 1, &h->quarantine_cooldown);
    } else if (key == "crash_log_per_second") {
      if ((ok = r.integer(n, key, 1, 1'000'000, &v)))
        c->crash_log_per_second = static_cast<uint32_t>(v);
    } else if (key == "slow_lane") {
      ok = r.boolean(n, key, &h->slow_lane);
    } else if (key == "slow_lane_release_after") {
      if ((ok = r.integer(n, key, 1, 10'000, &v))) h->slow_lane_release_after = static_cast<int>(v);
    } else if (key == "slow_lane_max_in_flight") {
      if ((ok = r.integer(n, key, 1, 100'000, &v)))
        h->slow_lane_max_in_flight = static_cast<std::size_t>(v);
    } else {
      r.err = "unknown key host." + std::string(key);
      ok = false;
    }
    if (!ok) return r.at(n);
  }
  return true;
}

const char* single_flight_name(SingleFlight s) {
  switch (s) {
    case SingleFlight::refuse:
      return "refuse";
    case SingleFlight::coalesce_latest:
      return "coalesce_latest";
    case SingleFlight::off:
      return "off";
  }
  return "refuse";
}

}  // namespace

std::string load_config_file(const std::string& path, DaemonConfig* cfg) {
  toml::table root;
  // toml++ says "File could not be opened" at 0:0; the operator wants the reason.
  if (FILE* f = std::fopen(path.c_str(), "rb"))
    std::fclose(f);
  else
    return path + ": " + std::strerror(errno);
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << path << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
       << e.description();
    return os.str();
  }
  Reader r;
  for (auto&& [k, n] : root) {
    const toml::table* t = n.as_table();
    // PATH:LINE:COL: what is wrong with the value there.
    if (k.str() == "daemon" && t) {
      if (!read_daemon(*t, cfg, r)) return path + ":" + r.err;
    } else if (k.str() == "host" && t) {
      if (!read_host(*t, cfg, r)) return path + ":" + r.err;
    } else {
      return path + ":" + std::to_string(n.source().begin.line) + ":" +
             std::to_string(n.source().begin.column) + ": unknown top-level key or section '" +
             std::string(k.str()) + "' (expected [daemon] and [host])";
    }
  }
  return {};
}

std::vector<std::string> check_environment(const DaemonConfig& cfg) {
  std::vector<std::string> out;
  if (!cfg.socket_group.empty()) {
    char buf[4096];
    group gr{}, *found = nullptr;
    char* end = nullptr;
    std::strtoul(cfg.socket_group.c_str(), &end, 10);
    const bool numeric = *end == 0 && end != cfg.socket_group.c_str();
    if (!numeric &&
        (::getgrnam_r(cfg.socket_group.c_str(), &gr, buf, sizeof buf, &found) != 0 || !found))
      out.push_back("daemon.socket_group: no group named '" + cfg.socket_group + "'");
  }
  if (std::string why = log_dir_problem(cfg.log_file); !why.empty())
    out.push_back("daemon.log_file: " + why);
  return out;
}

std::string finalize_config(DaemonConfig* cfg) {
  if (cfg->socket.empty()) {
    cfg->socket = default_socket_path();
    cfg->socket_is_default = true;
  }
  if (cfg->cache_dir.empty()) cfg->cache_dir = default_cache_dir();
  if (!cfg->uids_set && cfg->allowed_uids.empty()) {
    cfg->allowed_uids.push_back(static_cast<uint32_t>(geteuid()));
    if (geteuid() != 0) cfg->allowed_uids.push_back(0);
  }
  if (!cfg->admin_set && cfg->admin_uids.empty()) {
    cfg->admin_uids.push_back(static_cast<uint32_t>(geteuid()));
    if (geteuid() != 0) cfg->admin_uids.push_back(0);
  }
  if (cfg->max_registry_bytes_per_uid == 0)
    cfg->max_registry_bytes_per_uid = cfg->host.max_script_bytes / 2;
  static const char* levels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  bool level_ok = false;
  for (const char* l : levels) level_ok |= cfg->log_level == l;
  if (!level_ok)
    return "daemon.log_level: expected trace, debug, info, warn, error, critical or off";
  if (cfg->socket.size() >= 108) return "daemon.socket: path longer than 107 bytes (sun_path)";
  // The Host's own rules, the same ones Host::create enforces (outrun::validate).
  if (Error e = validate(cfg->host)) return "[host]: " + e.message;
  if (cfg->max_client_queued_bytes < 4096 || cfg->max_client_queued_bytes > (std::size_t{1} << 40))
    return "daemon.max_client_queued_bytes: expected 4096..2^40";
  return {};
}

std::string to_toml(const DaemonConfig& c) {
  auto ids = [](const std::vector<uint32_t>& v) {
    toml::array a;
    for (uint32_t x : v) a.push_back(static_cast<int64_t>(x));
    return a;
  };
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", c.socket_mode);
  toml::table d{{"socket", c.socket},
                {"socket_mode", std::string(mode)},
                {"allowed_uids", ids(c.allowed_uids)},
                {"allowed_gids", ids(c.allowed_gids)},
                {"socket_group", c.socket_group},
                {"admin_uids", ids(c.admin_uids)},
                {"admin_gids", ids(c.admin_gids)},
                {"max_clients", c.max_clients},
                {"max_pending_hello", c.max_pending_hello},
                {"hello_timeout_ms", static_cast<int64_t>(c.hello_timeout.count())},
                {"max_inflight_per_client", static_cast<int64_t>(c.max_inflight_per_client)},
                {"drain_timeout_ms", static_cast<int64_t>(c.drain_timeout.count())},
                {"log_level", c.log_level},
                {"log_file", c.log_file},
                {"cache_dir", c.cache_dir},
                {"tags_file", c.tags_file},
                {"tags_strict", c.tags_strict},
                {"state_dir", c.state_dir},
                {"state_flush_ms", static_cast<int64_t>(c.state_flush.count())},
                {"max_state_store_bytes", static_cast<int64_t>(c.max_state_store_bytes)},
                {"max_log_bytes", static_cast<int64_t>(c.max_log_bytes)},
                {"max_subscriber_bytes", static_cast<int64_t>(c.max_subscriber_bytes)},
                {"max_client_queued_bytes", static_cast<int64_t>(c.max_client_queued_bytes)}};
  for (const auto& [k, v] : {std::pair<const char*, std::size_t>{"max_tags", c.max_tags},
                             {"max_tags_per_define", c.max_tags_per_define},
                             {"metrics_per_tag_series", c.metrics_per_tag_series},
                             {"max_tag_sources", c.max_tag_sources},
                             {"max_tag_source_bytes", c.max_tag_source_bytes},
                             {"max_tag_source_value_bytes", c.max_tag_source_value_bytes},
                             {"max_tag_sources_per_uid", c.max_tag_sources_per_uid},
                             {"max_tag_source_bytes_per_uid", c.max_tag_source_bytes_per_uid},
                             {"max_subscribed_ids", c.max_subscribed_ids},
                             {"max_tag_reads_per_client", c.max_tag_reads_per_client},
                             {"max_read_evaluations", c.max_read_evaluations}})
    d.insert(k, static_cast<int64_t>(v));
  d.insert("max_registry_bytes_per_uid", static_cast<int64_t>(c.max_registry_bytes_per_uid));
  d.insert("max_registry_scripts_per_uid", static_cast<int64_t>(c.max_registry_scripts_per_uid));
  d.insert("max_crashes_per_uid", static_cast<int64_t>(c.max_crashes_per_uid));
  d.insert("crash_window_ms", static_cast<int64_t>(c.crash_window.count()));
  d.insert("crash_cooldown_ms", static_cast<int64_t>(c.crash_cooldown.count()));
  const HostOptions& h = c.host;
  toml::table ho{
      {"shards", h.shards},
      {"timeout_ms", static_cast<int64_t>(h.timeout.count())},
      {"grace_ms", static_cast<int64_t>(h.grace.count())},
      {"memory_limit_mb", static_cast<int64_t>(h.memory_limit >> 20)},
      {"worker_script_budget_mb", static_cast<int64_t>(h.worker_script_budget >> 20)},
      {"bytecode_cache_mb", static_cast<int64_t>(h.bytecode_cache_bytes >> 20)},
      {"worker_address_space_limit_mb", static_cast<int64_t>(h.worker_address_space_limit >> 20)},
      {"worker_path", h.worker_path},
      {"start_timeout_ms", static_cast<int64_t>(h.start_timeout.count())},
      {"shutdown_timeout_ms", static_cast<int64_t>(h.shutdown_timeout.count())},
      {"max_script_bytes_mb", static_cast<int64_t>(h.max_script_bytes >> 20)},
      {"worker_large_pages", h.worker_large_pages},
      {"callbacks_on_loop", h.callbacks_on_loop},
      {"busy_poll_us", static_cast<int64_t>(h.busy_poll.count())},
      {"max_queued_while_down", static_cast<int64_t>(h.max_queued_while_down)},
      {"restart_delay_ms", static_cast<int64_t>(h.restart_delay.count())},
      {"heartbeat_interval_ms", static_cast<int64_t>(h.heartbeat_interval.count())},
      {"silence_limit_ms", static_cast<int64_t>(h.silence_limit.count())},
      {"single_flight", std::string(single_flight_name(h.single_flight))},
      {"retries", h.retries},
      {"crash_loop_limit", h.crash_loop_limit},
      {"crash_loop_window_ms", static_cast<int64_t>(h.crash_loop_window.count())},
      {"crash_loop_cooldown_ms", static_cast<int64_t>(h.crash_loop_cooldown.count())},
      {"quarantine_after", h.quarantine_after},
      {"quarantine_cooldown_ms", static_cast<int64_t>(h.quarantine_cooldown.count())},
      {"crash_log_per_second", static_cast<int64_t>(c.crash_log_per_second)},
      {"slow_lane", h.slow_lane},
      {"slow_lane_release_after", h.slow_lane_release_after},
      {"slow_lane_max_in_flight", static_cast<int64_t>(h.slow_lane_max_in_flight)}};
  toml::table root{{"daemon", d}, {"host", ho}};
  std::ostringstream os;
  os << root << "\n";
  return os.str();
}

}  // namespace outrun::daemon
