// outrund: serves an outrun::Host on a Unix domain socket. See design/daemon.md.
//
//   outrund [--config FILE] [--socket PATH] [--shards K] [--timeout MS] ... [--check-config]
#include <mimalloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <iostream>

#include "config.h"
#include "outrun/tags.h"
#include "server.h"
#include "tags_file.h"

namespace {

// --check-config with a tags file: every error of the file, and every script compiled in a
// worker (a confined process, as at start), each as FILE:LINE:COL: message.
void check_tags_file(const outrun::daemon::DaemonConfig& cfg, std::vector<std::string>* out) {
  using namespace outrun;
  std::vector<tags::TagDefinition> defs;
  std::vector<std::string> file_errors;
  if (!tags::file::load_tags_file(cfg.tags_file, &defs, &file_errors)) {
    for (auto& line : tags::file::describe_errors(file_errors, {})) out->push_back(line);
    return;
  }
  HostOptions o = cfg.host;
  o.shards = 1;
  o.bytecode_cache_bytes = 0;
  std::unique_ptr<Host> host;
  if (Error e = Host::create(o, &host)) {
    out->push_back("cannot start a worker to compile the tags' scripts: " + e.message);
    return;
  }
  tags::TagsOptions to;
  to.real_time_periodic = false;
  std::unique_ptr<tags::Engine> engine;
  if (Error e = tags::Engine::create(*host, to, &engine)) {
    out->push_back(e.message);
    return;
  }
  tags::ApplyOptions ao;
  ao.replace_all = true;
  tags::ApplyResult res;
  if (Error e = engine->apply(defs, ao, &res); e && res.errors.empty())
    out->push_back(cfg.tags_file + ": " + e.message);
  for (auto& line : tags::file::describe_errors({}, res.errors)) out->push_back(line);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace outrun::daemon;
  // mimalloc is the process's malloc. By default it decommits freed memory only after a delay,
  // and only when the thread that owns it allocates again: the dispatcher threads that built a
  // burst's answers then sit idle holding it. Decommitting at once returns a burst's memory
  // (8 clients x 250 MB of answers: 125 MB resident after, 37 MB with this; design/daemon.md
  // "Memory after a burst").
  mi_option_set(mi_option_decommit_delay, 0);
  mi_option_set(mi_option_segment_decommit_delay, 0);
  CLI::App app{
      "outrund: the outrun daemon (Lua 5.4 scripts in worker processes, served on a Unix socket)"};
  std::string config_file, socket, socket_mode, log_level, log_file, worker, single_flight,
      tags_file, state_dir;
  int state_flush_ms = 0;
  int shards = 0, timeout_ms = 0, grace_ms = -1, memory_mb = 0, drain_ms = -1, max_clients = 0;
  long max_inflight = 0;
  long long max_queued_bytes = 0;
  std::vector<uint32_t> uids, gids;
  bool check = false;
  app.add_option("-c,--config", config_file, "TOML configuration file (design/daemon.md)");
  app.add_option("-s,--socket", socket, "socket path (daemon.socket)");
  app.add_option("--socket-mode", socket_mode,
                 "socket file permission bits, octal (daemon.socket_mode)");
  app.add_option("--allow-uid", uids, "allowed peer uid, repeatable; replaces daemon.allowed_uids");
  app.add_option("--allow-gid", gids, "allowed peer gid, repeatable; replaces daemon.allowed_gids");
  app.add_option("--max-clients", max_clients, "daemon.max_clients")->check(CLI::Range(1, 65536));
  app.add_option("--max-inflight-per-client", max_inflight, "daemon.max_inflight_per_client")
      ->check(CLI::Range(1L, 10'000'000L));
  app.add_option("--max-client-queued-bytes", max_queued_bytes, "daemon.max_client_queued_bytes")
      ->check(CLI::Range(4096LL, 1LL << 40));
  app.add_option("--drain-timeout", drain_ms, "daemon.drain_timeout_ms")
      ->check(CLI::Range(0, 86'400'000));
  app.add_option("--log-level", log_level, "daemon.log_level");
  app.add_option("--log-file", log_file, "daemon.log_file (empty: stderr)");
  app.add_option("--shards", shards, "host.shards")->check(CLI::Range(1, 64));
  app.add_option("--timeout", timeout_ms, "host.timeout_ms")->check(CLI::Range(1, 3'600'000));
  app.add_option("--grace", grace_ms, "host.grace_ms")->check(CLI::Range(0, 3'600'000));
  app.add_option("--memory-limit", memory_mb, "host.memory_limit_mb")->check(CLI::Range(1, 65536));
  app.add_option("--single-flight", single_flight,
                 "host.single_flight: refuse, coalesce_latest or off");
  app.add_option("--worker", worker, "host.worker_path");
  app.add_option("--tags", tags_file,
                 "tags file (TOML, design/tags.md) defined at start and re-read on SIGHUP "
                 "(daemon.tags_file)");
  app.set_version_flag("--version", "outrund " OUTRUN_VERSION);
  app.add_option("--state-dir", state_dir,
                 "keep tag states and last values across restarts here (daemon.state_dir)");
  app.add_option("--state-flush-ms", state_flush_ms, "daemon.state_flush_ms")
      ->check(CLI::Range(1, 60'000));
  app.add_flag("--check-config", check, "validate the configuration, print it as TOML and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a usage error exits 2 (CLI11's own codes are 100+).
    return app.exit(e) == 0 ? 0 : 2;
  }

  DaemonConfig cfg;
  if (config_file.empty()) {
    // No --config: the system file as root, the user's otherwise, if it exists.
    std::string def = "/etc/outrun/outrund.toml";
    if (geteuid() != 0) {
      const char* x = std::getenv("XDG_CONFIG_HOME");
      const char* h = std::getenv("HOME");
      def = x && *x ? std::string(x) + "/outrun/outrund.toml"
            : h     ? std::string(h) + "/.config/outrun/outrund.toml"
                    : "";
    }
    if (!def.empty() && ::access(def.c_str(), F_OK) == 0) config_file = def;
  }
  if (!config_file.empty()) {
    if (std::string err = load_config_file(config_file, &cfg); !err.empty()) {
      std::cerr << "outrund: " << err << "\n";
      return 2;
    }
  }
  if (!socket.empty()) cfg.socket = socket;
  if (!socket_mode.empty()) {
    char* end = nullptr;
    const long m = std::strtol(socket_mode.c_str(), &end, 8);
    if (*end || m < 0 || m > 0777) {
      std::cerr << "outrund: --socket-mode expects octal permission bits like 0660\n";
      return 2;
    }
    cfg.socket_mode = static_cast<unsigned>(m);
  }
  if (!uids.empty()) {
    cfg.allowed_uids = uids;
    cfg.uids_set = true;
  }
  if (!gids.empty()) cfg.allowed_gids = gids;
  if (max_clients) cfg.max_clients = max_clients;
  if (max_inflight) cfg.max_inflight_per_client = static_cast<uint32_t>(max_inflight);
  if (max_queued_bytes) cfg.max_client_queued_bytes = static_cast<std::size_t>(max_queued_bytes);
  if (drain_ms >= 0) cfg.drain_timeout = std::chrono::milliseconds(drain_ms);
  if (!log_level.empty()) cfg.log_level = log_level;
  if (!log_file.empty()) cfg.log_file = log_file;
  if (!tags_file.empty()) cfg.tags_file = tags_file;
  if (!state_dir.empty()) cfg.state_dir = state_dir;
  // systemd's StateDirectory= (the unit's /var/lib/outrund), unless the file or a flag chose.
  if (const char* sd = std::getenv("STATE_DIRECTORY"); cfg.state_dir.empty() && sd && *sd) {
    const std::string dirs = sd;
    cfg.state_dir = dirs.substr(0, dirs.find(':'));
  }
  if (state_flush_ms) cfg.state_flush = std::chrono::milliseconds(state_flush_ms);
  if (shards) cfg.host.shards = shards;
  if (timeout_ms) cfg.host.timeout = std::chrono::milliseconds(timeout_ms);
  if (grace_ms >= 0) cfg.host.grace = std::chrono::milliseconds(grace_ms);
  if (memory_mb) cfg.host.memory_limit = static_cast<std::size_t>(memory_mb) << 20;
  if (!worker.empty()) cfg.host.worker_path = worker;
  if (!single_flight.empty()) {
    if (single_flight == "refuse")
      cfg.host.single_flight = outrun::SingleFlight::refuse;
    else if (single_flight == "coalesce_latest")
      cfg.host.single_flight = outrun::SingleFlight::coalesce_latest;
    else if (single_flight == "off")
      cfg.host.single_flight = outrun::SingleFlight::off;
    else {
      std::cerr << "outrund: --single-flight expects refuse, coalesce_latest or off\n";
      return 2;
    }
  }
  if (std::string err = finalize_config(&cfg); !err.empty()) {
    std::cerr << "outrund: " << err << "\n";
    return 2;
  }
  {
    std::vector<std::string> problems = check_environment(cfg);
    if (check && !cfg.tags_file.empty()) check_tags_file(cfg, &problems);
    for (const auto& p : problems) std::cerr << "outrund: " << p << "\n";
    if (!problems.empty()) return 2;
  }
  if (check) {
    std::cout << to_toml(cfg);
    return 0;
  }
  // Signals are handled on the loop (uv_signal); a client that vanished must not kill us.
  std::signal(SIGPIPE, SIG_IGN);
  Server server(std::move(cfg));
  return server.run();
}
