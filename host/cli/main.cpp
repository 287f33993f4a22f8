// outrun: the command line.
//
//   outrun [--socket PATH] eval [--shards K] [--timeout MS] [--grace MS] [--memory-limit MB]
//               (-e SOURCE | -f FILE) [-i NAME=VALUE]... [--inputs-json JSON] [--json]
//               [--in-process]
//   outrun [--socket PATH] stats [--json | --prometheus] | shards | scripts | kill-shard N |
//               restart-shard N | unregister KEY | register KEY (-e SOURCE | -f FILE) [--check]
//   outrun [--socket PATH] bench [--clients C] [--count N] [--shards K] [--in-process]
//   outrun [--socket PATH] drill NAME [--rate R] [--duration S] [--shards K] [--json]
// --socket (or $OUTRUN_SOCKET) sends eval through outrund; the administration commands always
// talk to outrund (default socket: see outrun::default_client_socket()).

#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "drill.h"
#include "eval_cmd.h"
#include "json_values.h"
#include "latency_histogram.h"
#include "logs_cmd.h"
#include "outrun/client.h"
#include "outrun/host.h"
#include "outrun/in_process.h"
#include "stats_format.h"
#include "tags_cmd.h"

namespace outrun::cli {

namespace {

std::string g_socket;  // --socket

// --socket given, or $OUTRUN_SOCKET set: eval and bench go through outrund.
bool socket_given() {
  return outrun::cli::socket_given(&g_socket);
}

int connect_client(std::unique_ptr<Client>* out) {
  ClientOptions o;
  o.socket = g_socket;
  o.name = "outrun-cli";
  if (Error err = Client::connect(o, out)) {
    std::cerr << to_string(err.code) << ": " << err.message << "\n";
    return 3;
  }
  return 0;
}

enum class StatsFormat { text, json, prometheus };

// `outrun reload`: SIGHUP to outrund (its pid from its stats), then wait until a reload that
// started after the signal has finished, and say how it went: exit 0 applied, 1 not applied
// (every error printed), 3 no daemon. systemd's ExecReload runs it, so that `systemctl reload`
// fails when the tags file does not apply (design/daemon.md "Reload").
int run_reload(int timeout_s) {
  std::unique_ptr<Client> c;
  if (int rc = connect_client(&c)) return rc;
  auto reload_state = [&](nlohmann::json* out) -> bool {
    std::string doc;
    if (Error e = c->stats_json(&doc)) {
      std::cerr << "outrun: " << to_string(e.code) << ": " << e.message << "\n";
      return false;
    }
    *out = nlohmann::json::parse(doc, nullptr, false);
    if (out->is_discarded() || !out->contains("reload") || !out->contains("pid")) {
      std::cerr << "outrun: this outrund does not report reloads (too old?)\n";
      return false;
    }
    return true;
  };
  nlohmann::json j;
  if (!reload_state(&j)) return 1;
  const auto pid = j["pid"].get<pid_t>();
  const auto before = j["reload"]["requested"].get<uint64_t>();
  if (::kill(pid, SIGHUP) != 0) {
    std::cerr << "outrun: cannot signal outrund (pid " << pid << "): " << std::strerror(errno)
              << "\n";
    return 1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  uint64_t target =
      0;  // the SIGHUP count once ours was seen: a reload covering it read the file after
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!reload_state(&j)) return 1;
    const auto& r = j["reload"];
    if (target == 0 && r["requested"].get<uint64_t>() > before)
      target = r["requested"].get<uint64_t>();
    if (target != 0 && r["covered"].get<uint64_t>() >= target) break;
    if (std::chrono::steady_clock::now() > deadline) {
      std::cerr << "outrun: outrund (pid " << pid << ") did not finish the reload in " << timeout_s
                << " s\n";
      return 1;
    }
  }
  const auto& r = j["reload"];
  for (const auto& e : r["errors"])
    if (e.is_string())
      std::cerr << "outrun: " << json_values::escape_control(e.get<std::string>()) << "\n";
  if (!r["ok"].get<bool>()) {
    std::cerr << "outrun: reload failed: outrund kept the tags it was running\n";
    return 1;
  }
  std::cout << "reloaded\n";
  return 0;
}

int run_admin(const std::string& what, StatsFormat fmt, int shard) {
  std::unique_ptr<Client> c;
  if (int rc = connect_client(&c)) return rc;
  std::string doc;
  Error err;
  if (what == "stats")
    err = c->stats_json(&doc);
  else if (what == "shards")
    err = c->shards_json(&doc);
  else if (what == "scripts")
    err = c->scripts_json(&doc);
  else if (what == "kill-shard")
    err = c->kill_shard(shard);
  else if (what == "restart-shard")
    err = c->restart_shard(shard);
  if (err) {
    std::cerr << to_string(err.code) << ": " << err.message << "\n";
    return 1;
  }
  if (doc.empty()) {
    std::cout << (what == "kill-shard" ? "killed" : "restarting") << " shard " << shard << "\n";
    return 0;
  }
  nlohmann::json j = nlohmann::json::parse(doc, nullptr, false);
  if (j.is_discarded()) {
    std::cerr << "outrund sent a document that is not JSON\n";
    return 1;
  }
  if (fmt == StatsFormat::json)
    std::cout << j.dump(2) << "\n";
  else if (fmt == StatsFormat::prometheus)
    std::cout << stats_prometheus(j);
  else if (what == "stats")
    std::cout << stats_text(j);
  else if (what == "shards")
    std::cout << shards_text(j);
  else
    std::cout << scripts_text(j);
  return 0;
}

// Every ListScripts page (design/protocol.md "Paged ListScripts"), printed as it comes: the table,
// or one {"scripts": [...]} document laid out as `dump(2)` of the whole would be (never held
// whole: 300,000 scripts would take a few hundred MB as nlohmann::json).
int run_scripts(bool as_json) {
  std::unique_ptr<Client> c;
  if (int rc = connect_client(&c)) return rc;
  std::string after, page;
  std::size_t listed = 0;
  if (as_json) std::cout << "{\n  \"scripts\": [";
  for (bool first = true;; first = false) {
    if (Error err = c->scripts_page_json(after, 10000, &page)) {
      if (as_json) std::cout << std::endl;
      std::cerr << to_string(err.code) << ": " << err.message << "\n";
      return 1;
    }
    nlohmann::json j = nlohmann::json::parse(page, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      std::cerr << "outrund sent a document that is not JSON\n";
      return 1;
    }
    if (!as_json) {
      std::cout << scripts_text(j, first);
    } else if (auto it = j.find("scripts"); it != j.end() && it->is_array()) {
      for (const auto& item : *it) {
        const std::string s = item.dump(2);  // the daemon's document is valid UTF-8 (it replaces)
        std::string indented = listed++ ? ",\n    " : "\n    ";
        for (char ch : s) {
          indented += ch;
          if (ch == '\n') indented += "    ";
        }
        std::cout << indented;
      }
    }
    auto next = j.find("next");  // absent: a daemon from before paging sent everything at once
    if (next == j.end() || !next->is_string() || next->get<std::string>() == after) break;
    after = next->get<std::string>();
  }
  if (as_json) std::cout << (listed ? "\n  ]\n}\n" : "]\n}\n");
  std::cout.flush();
  return 0;
}

int run_unregister(const std::string& key) {
  std::unique_ptr<Client> c;
  if (int rc = connect_client(&c)) return rc;
  if (Error err = c->unregister_script(key)) {
    std::cerr << to_string(err.code) << ": " << err.message << "\n";
    return 1;
  }
  std::cout << "unregistered " << key << "\n";
  return 0;
}

// `outrun register KEY (-e SOURCE | -f FILE) [--check]`: registers a script in outrund (it stays
// after this command). Exit codes (README): 0 registered; 1 `--check` found that the source does
// not compile (compile_error: KEY:LINE: ...); 2 bad usage or a registration refused
// (invalid_argument); 3 outrund unavailable (or the check could not be made).
struct RegisterArgs {
  std::string key, source, file;
  bool check = false;
};

int run_register(const RegisterArgs& a) {
  std::string source = a.source;
  if (!a.file.empty()) {
    std::ifstream f(a.file, std::ios::binary);
    if (!f) {
      std::cerr << "invalid_argument: cannot read '" << a.file << "'\n";
      return kExitUsage;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    source = ss.str();
  }
  std::unique_ptr<Client> c;
  if (int rc = connect_client(&c)) return rc;
  Script script;
  RegisterOptions ro;
  ro.check = a.check;
  if (Error err = c->register_script(a.key, source, &script, ro)) {
    std::cerr << to_string(err.code) << ": " << json_values::escape_control(err.message) << "\n";
    return err.code == ErrorCode::compile_error ? kExitFailed
           : err.code == ErrorCode::unavailable ? kExitNoRunner
                                                : kExitUsage;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string sha;
  for (uint8_t b : script.sha256()) {
    sha += kHex[b >> 4];
    sha += kHex[b & 15];
  }
  std::cout << "registered " << json_values::escape_control(a.key) << " (shard " << script.shard()
            << ", sha256 " << sha << ")\n";
  return 0;
}

struct BenchArgs {
  int clients = 1;
  int count = 20000;
  int shards = 2;
  bool in_process = false;
};

// Closed loop: each of C threads evaluates its own script (its own key, so single flight never
// refuses), waits for the result, and goes again. Prints round-trip percentiles and throughput.
int run_bench(const BenchArgs& a) {
  std::unique_ptr<Runner> runner;
  std::string mode;
  if (socket_given()) {
    std::unique_ptr<Client> c;
    if (int rc = connect_client(&c)) return rc;
    runner = std::move(c);
    mode = "daemon (" + g_socket + ")";
  } else if (a.in_process) {
    runner = std::make_unique<InProcess>(InProcessOptions{});
    mode = "in-process";
  } else {
    HostOptions o;
    o.shards = a.shards;
    std::unique_ptr<Host> h;
    if (Error err = Host::create(o, &h)) {
      std::cerr << to_string(err.code) << ": " << err.message << "\n";
      return 3;
    }
    runner = std::move(h);
    mode = "embedded Host, " + std::to_string(a.shards) + " shards";
  }
  std::vector<Script> scripts(a.clients);
  for (int t = 0; t < a.clients; ++t)
    if (Error err = runner->register_script("bench." + std::to_string(t),
                                            "return inputs.a + inputs.b", &scripts[t])) {
      std::cerr << to_string(err.code) << ": " << err.message << "\n";
      return 1;
    }
  const int per = std::max(1, a.count / a.clients);
  // Warm up: compile on the workers.
  for (int t = 0; t < a.clients; ++t) runner->evaluate(scripts[t], {{"a", 1}, {"b", 2}}).get();
  LatencyHistogram lat;  // ns, recorded by every thread
  std::atomic<int> errors{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> th;
  for (int t = 0; t < a.clients; ++t)
    th.emplace_back([&, t] {
      for (int i = 0; i < per; ++i) {
        const auto s = std::chrono::steady_clock::now();
        Result r = runner->evaluate(scripts[t], {{"a", i}, {"b", 1}}).get();
        lat.record(std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now() - s)
                       .count());
        if (r.status != Status::ok || !(r.value == Value(int64_t{i} + 1))) errors.fetch_add(1);
      }
    });
  for (auto& x : th) x.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const uint64_t n = lat.count();
  auto q = [&](double p) { return static_cast<double>(lat.quantile(p)) / 1e3; };
  nlohmann::json j{{"mode", mode},     {"clients", a.clients},
                   {"evaluations", n}, {"errors", errors.load()},
                   {"seconds", secs},  {"per_second", static_cast<double>(n) / secs},
                   {"p50_us", q(0.5)}, {"p90_us", q(0.9)},
                   {"p99_us", q(0.99)}};
  std::cout << j.dump() << "\n";
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace outrun::cli

int main(int argc, char** argv) {
  using namespace outrun::cli;
  CLI::App app{"outrun: run untrusted Lua 5.4 scripts out of process"};
  app.set_version_flag("--version", "outrun " OUTRUN_VERSION);
  app.require_subcommand(1);
  app.fallthrough();  // --socket before or after the command
  app.add_option("--socket", g_socket,
                 "outrund socket (default $OUTRUN_SOCKET, else the daemon's default)");
  int rc = 0;
  add_eval_command(app, &rc, &g_socket);

  StatsFormat fmt = StatsFormat::text;
  bool as_json = false, as_prom = false;
  auto* stats =
      app.add_subcommand("stats", "outrund: shards, evaluations by status, latency, clients");
  auto* sj = stats->add_flag("--json", as_json, "print the JSON document");
  stats->add_flag("--prometheus", as_prom, "Prometheus text exposition format")->excludes(sj);
  auto* shards =
      app.add_subcommand("shards", "outrund: state, pid, uptime, restarts and RSS of each shard");
  shards->add_flag("--json", as_json, "print the JSON document");
  auto* scripts =
      app.add_subcommand("scripts", "outrund: registered scripts with hashes and counts");
  scripts->add_flag("--json", as_json, "print the JSON document");
  int shard_n = 0;
  auto* kill = app.add_subcommand("kill-shard", "outrund: SIGKILL a shard's worker (it restarts)");
  kill->add_option("shard", shard_n, "shard index")->required();
  auto* restart =
      app.add_subcommand("restart-shard", "outrund: restart a shard's worker gracefully");
  restart->add_option("shard", shard_n, "shard index")->required();
  std::string unregister_key;
  auto* unreg = app.add_subcommand(
      "unregister", "outrund: unregister a script key (its handles end invalid_argument)");
  unreg->add_option("key", unregister_key, "the script key")->required();
  unreg->callback([&] { rc = run_unregister(unregister_key); });
  RegisterArgs ra;
  auto* reg = app.add_subcommand(
      "register",
      "outrund: register a script under a key (it stays registered after this command)");
  reg->add_option("key", ra.key, "the script key")->required();
  auto* re = reg->add_option("-e,--source", ra.source, "Lua source");
  auto* rf = reg->add_option("-f,--file", ra.file, "file with the Lua source");
  re->excludes(rf);
  reg->add_flag("--check", ra.check,
                "compile-check the source first: exit 1 with compile_error KEY:LINE: ... and "
                "register nothing when it does not compile");
  reg->callback([&] {
    if (reg->count("-e") == 0 && ra.file.empty()) throw CLI::RequiredError("-e SOURCE or -f FILE");
    rc = run_register(ra);
  });
  BenchArgs ba;
  auto* bench = app.add_subcommand(
      "bench", "closed-loop round trips: through outrund with --socket, else embedded");
  bench->add_option("--clients", ba.clients, "concurrent closed-loop callers")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  bench->add_option("--count", ba.count, "evaluations in total")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  bench->add_option("--shards", ba.shards, "embedded Host shards")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  bench->add_flag("--in-process", ba.in_process, "InProcess runner instead of an embedded Host");
  DrillArgs da;
  std::string drill_list;
  for (const auto& n : drill_names()) drill_list += (drill_list.empty() ? "" : ", ") + n;
  auto* drill = app.add_subcommand(
      "drill", "resilience drill under load: " + drill_list +
                   ". Against outrund at --socket, else a private outrund this command starts");
  drill->add_option("name", da.name, "the drill")->required()->check(CLI::IsMember(drill_names()));
  drill->add_option("--rate", da.rate, "evaluations per second (open loop)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  drill->add_option("--duration", da.duration_s, "seconds of load; the fault comes at a third")
      ->check(CLI::Range(1.0, 600.0))
      ->capture_default_str();
  auto* drill_shards = drill->add_option("--shards", da.shards, "shards of the private outrund")
                           ->check(CLI::Range(1, 64))
                           ->capture_default_str();
  drill->add_option("--outrund", da.outrund,
                    "daemon binary for the private outrund (default: next to outrun, else PATH)");
  drill->add_flag("--json", da.json,
                  "one JSON object: submitted, completed (by status), lost, duplicated, "
                  "recovery_ms, latency_us, ...");
  drill->callback([&] {
    da.shards_given = drill_shards->count() > 0;
    if (socket_given()) da.socket = g_socket;
    rc = run_drill(da);
  });
  for (auto* sc : {stats, shards, scripts, kill, restart})
    sc->callback([&, sc] {
      if (as_prom)
        fmt = StatsFormat::prometheus;
      else if (as_json)
        fmt = StatsFormat::json;
      rc = sc == scripts ? run_scripts(as_json) : run_admin(sc->get_name(), fmt, shard_n);
    });
  int reload_timeout = 60;
  auto* reload = app.add_subcommand(
      "reload", "outrund: reopen logs and re-read the tags file (SIGHUP), and wait for the result");
  reload->add_option("--timeout", reload_timeout, "seconds to wait for the reload")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  reload->callback([&] { rc = run_reload(reload_timeout); });
  add_tags_commands(app, &rc, &g_socket);
  add_logs_commands(app, &rc, &g_socket);
  bench->callback([&] { rc = run_bench(ba); });
  return run_app(app, argc, argv, &rc);
}
