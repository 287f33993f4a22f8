// `outrun eval` (eval_cmd.h): one script, one result, through workers this command starts, the
// in-process runner, or outrund.
#include "eval_cmd.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "json_values.h"
#include "outrun/host.h"
#include "outrun/in_process.h"
#ifndef _WIN32
#include "outrun/client.h"
#endif

namespace outrun::cli {

bool socket_given(std::string* socket) {
  if (!socket->empty()) return true;
  if (const char* env = std::getenv("OUTRUN_SOCKET"); env && *env) {
    *socket = env;
    return true;
  }
  return false;
}

int run_app(CLI::App& app, int argc, char** argv, const int* rc) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    const int code = app.exit(err);
    return code == 0 ? 0 : kExitUsage;
  }
  return *rc;
}

namespace {

struct EvalArgs {
  int shards = 1;
  int timeout_ms = 100;
  int grace_ms = 100;
  int memory_mb = 16;
  std::string source;
  std::string file;
  std::vector<std::string> inputs;
  std::string inputs_json;
  bool json = false;
  bool in_process = false;
  std::string key = "cli";
  bool host_options_given = false;  // --shards, --timeout, --grace or --memory-limit
};

// A failure before there is a result: with --json one document on stdout, as for results
// (shard -1), else "STATUS: message" on stderr.
int eval_failed(const EvalArgs& a, ErrorCode error, const std::string& message, int code) {
  if (a.json) {
    nlohmann::json j{{"status", std::string(to_string(error))},
                     {"value", nullptr},
                     {"error", message},
                     {"shard", -1},
                     {"latency_us", 0}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cerr << to_string(error) << ": " << message << "\n";
  }
  return code;
}

int run_eval(const EvalArgs& a, std::string* socket) {
  std::string source = a.source;
  if (!a.in_process && socket_given(socket) && a.host_options_given)
    return eval_failed(a, ErrorCode::invalid_argument,
                       "--shards, --timeout, --grace and --memory-limit configure the workers "
                       "this command starts; through outrund (--socket, $OUTRUN_SOCKET) the "
                       "daemon's own settings apply (host.timeout_ms and others in its config)",
                       kExitUsage);
  if (!a.file.empty()) {
    std::ifstream f(a.file, std::ios::binary);
    if (!f)
      return eval_failed(a, ErrorCode::invalid_argument, "cannot read '" + a.file + "'",
                         kExitUsage);
    std::stringstream ss;
    ss << f.rdbuf();
    source = ss.str();
  }
  Inputs inputs;
  if (!a.inputs_json.empty()) {
    nlohmann::json j = nlohmann::json::parse(a.inputs_json, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return eval_failed(a, ErrorCode::invalid_argument, "--inputs-json must be a JSON object",
                         kExitUsage);
    for (auto it = j.begin(); it != j.end(); ++it) {
      Input in{it.key(), {}};
      std::string err;
      if (!json_values::from_json(it.value(), &in.value, &err))
        return eval_failed(a, ErrorCode::invalid_argument, err, kExitUsage);
      inputs.push_back(std::move(in));
    }
  }
  for (const auto& kv : a.inputs) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return eval_failed(a, ErrorCode::invalid_argument, "-i expects NAME=VALUE, got '" + kv + "'",
                         kExitUsage);
    std::string err;
    Value v = json_values::parse_scalar(kv.substr(eq + 1), &err);
    if (!err.empty())
      return eval_failed(a, ErrorCode::invalid_argument, "-i " + kv.substr(0, eq) + ": " + err,
                         kExitUsage);
    inputs.push_back(Input{kv.substr(0, eq), std::move(v)});
  }

  std::unique_ptr<Runner> runner;
  if (!a.in_process && socket_given(socket)) {
#ifndef _WIN32
    std::unique_ptr<Client> client;
    ClientOptions co;
    co.socket = *socket;
    co.name = "outrun-cli";
    if (Error err = Client::connect(co, &client))
      return eval_failed(a, err.code, err.message, kExitNoRunner);
    runner = std::move(client);
#else
    return eval_failed(a, ErrorCode::unavailable,
                       "outrund does not run on Windows yet (design/windows.md): without --socket "
                       "and $OUTRUN_SOCKET, eval starts its own workers",
                       kExitNoRunner);
#endif
  } else if (a.in_process) {
    InProcessOptions o;
    o.timeout = std::chrono::milliseconds(a.timeout_ms);
    o.memory_limit = static_cast<std::size_t>(a.memory_mb) << 20;
    runner = std::make_unique<InProcess>(o);
  } else {
    HostOptions o;
    o.shards = a.shards;
    o.timeout = std::chrono::milliseconds(a.timeout_ms);
    o.grace = std::chrono::milliseconds(a.grace_ms);
    o.memory_limit = static_cast<std::size_t>(a.memory_mb) << 20;
    std::unique_ptr<Host> host;
    if (Error err = Host::create(o, &host))
      return eval_failed(a, err.code, err.message, kExitNoRunner);
    runner = std::move(host);
  }
  Script script;
  if (Error err = runner->register_script(a.key, source, &script))
    return eval_failed(a, err.code, err.message,
                       err.code == ErrorCode::unavailable ? kExitNoRunner : kExitUsage);
  const auto t0 = std::chrono::steady_clock::now();
  Result r = runner->evaluate(script, std::move(inputs)).get();
  const auto latency_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  if (a.json) {
    nlohmann::json j{{"status", std::string(to_string(r.status))},
                     {"value", json_values::to_json(r.value)},
                     {"error", r.status == Status::ok ? nlohmann::json() : nlohmann::json(r.error)},
                     {"shard", r.shard},
                     {"latency_us", latency_us}};
    if (!r.logs.empty() || r.logs_dropped != 0) {
      nlohmann::json logs = nlohmann::json::array();
      for (const LogLine& l : r.logs)
        logs.push_back(
            {{"level", l.level == LogLevel::warn ? "warn" : to_string(l.level)}, {"text", l.text}});
      j["logs"] = std::move(logs);
      j["logs_dropped"] = r.logs_dropped;
    }
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return r.status == Status::ok ? 0 : kExitFailed;
  }
  // What the script printed or logged, on stderr before the result (stdout keeps the value).
  for (const LogLine& l : r.logs)
    std::cerr << (l.level == LogLevel::warn ? "warn" : to_string(l.level)) << ": " << l.text
              << "\n";
  if (r.logs_dropped != 0)
    std::cerr << "(" << r.logs_dropped
              << " more lines were dropped: an evaluation keeps at most 16 lines and 2 KiB)\n";
  if (r.status == Status::ok) {
    std::cout << json_values::escape_control(to_display_string(r.value)) << "\n";
  } else {
    std::cerr << to_string(r.status) << ": " << json_values::escape_control(r.error) << "\n";
  }
  return r.status == Status::ok ? 0 : kExitFailed;
}

}  // namespace

void add_eval_command(CLI::App& app, int* rc, std::string* socket) {
  auto args = std::make_shared<EvalArgs>();
  EvalArgs& ea = *args;
  auto* eval = app.add_subcommand("eval", "evaluate one script and print its result");
  std::vector<CLI::Option*> host_options{
      eval->add_option("--shards", ea.shards, "worker processes")
          ->check(CLI::Range(1, 64))
          ->capture_default_str(),
      eval->add_option("--timeout", ea.timeout_ms, "soft timeout T in ms (not with --socket)")
          ->check(CLI::Range(1, 3600000))
          ->capture_default_str(),
      eval->add_option("--grace", ea.grace_ms,
                       "grace G in ms before the worker is killed (not with --socket)")
          ->check(CLI::Range(0, 3600000))
          ->capture_default_str(),
      eval->add_option("--memory-limit", ea.memory_mb, "memory per script state, MB")
          ->check(CLI::Range(1, 65536))
          ->capture_default_str()};
  auto* e = eval->add_option("-e,--source", ea.source, "Lua source");
  auto* f = eval->add_option("-f,--file", ea.file, "file with the Lua source");
  e->excludes(f);
  eval->add_option("-i,--input", ea.inputs,
                   "input NAME=VALUE (true, false, nil, numbers, \"strings\", text)");
  eval->add_option("--inputs-json", ea.inputs_json, "inputs as a JSON object");
  eval->add_option("--key", ea.key, "script key (routes it to a shard)")->capture_default_str();
  eval->add_flag("--json", ea.json, "print {status, value, error, shard, latency_us}");
  eval->add_flag("--in-process", ea.in_process, "run in this process (trusted scripts, baseline)");
  // The arguments live as long as the callback (the app owns it).
  eval->callback([args, eval, host_options, rc, socket] {
    EvalArgs& a = *args;
    if (a.source.empty() && a.file.empty() && eval->count("-e") == 0)
      throw CLI::RequiredError("-e SOURCE or -f FILE");
    for (auto* o : host_options) a.host_options_given |= o->count() > 0;
    *rc = run_eval(a, socket);
  });
}

}  // namespace outrun::cli
