// outrun: the command line.
//
//   outrun eval [--shards K] [--timeout MS] [--grace MS] [--memory-limit MB]
//               (-e SOURCE | -f FILE) [-i NAME=VALUE]... [--inputs-json JSON] [--json] [--in-process]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "json_values.h"
#include "outrun/host.h"
#include "outrun/in_process.h"

namespace outrun::cli {

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
};

int run_eval(const EvalArgs& a) {
  std::string source = a.source;
  if (!a.file.empty()) {
    std::ifstream f(a.file, std::ios::binary);
    if (!f) {
      std::cerr << "invalid_argument: cannot read '" << a.file << "'\n";
      return 2;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    source = ss.str();
  }
  Inputs inputs;
  if (!a.inputs_json.empty()) {
    nlohmann::json j = nlohmann::json::parse(a.inputs_json, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      std::cerr << "invalid_argument: --inputs-json must be a JSON object\n";
      return 2;
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
      Input in{it.key(), {}};
      std::string err;
      if (!from_json(it.value(), &in.value, &err)) {
        std::cerr << "invalid_argument: " << err << "\n";
        return 2;
      }
      inputs.push_back(std::move(in));
    }
  }
  for (const auto& kv : a.inputs) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << "invalid_argument: -i expects NAME=VALUE, got '" << kv << "'\n";
      return 2;
    }
    inputs.push_back(Input{kv.substr(0, eq), parse_scalar(kv.substr(eq + 1))});
  }

  std::unique_ptr<Runner> runner;
  if (a.in_process) {
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
    if (Error err = Host::create(o, &host)) {
      std::cerr << to_string(err.status) << ": " << err.message << "\n";
      return 3;
    }
    runner = std::move(host);
  }
  Script script;
  if (Error err = runner->register_script(a.key, source, &script)) {
    std::cerr << to_string(err.status) << ": " << err.message << "\n";
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Result r = runner->evaluate(script, std::move(inputs)).get();
  const auto latency_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) {
    nlohmann::json j{{"status", std::string(to_string(r.status))},
                     {"value", to_json(r.value)},
                     {"error", r.status == Status::ok ? nlohmann::json() : nlohmann::json(r.error)},
                     {"shard", r.shard},
                     {"latency_us", latency_us}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else if (r.status == Status::ok) {
    std::cout << to_display_string(r.value) << "\n";
  } else {
    std::cerr << to_string(r.status) << ": " << r.error << "\n";
  }
  return r.status == Status::ok ? 0 : 1;
}

}  // namespace
}  // namespace outrun::cli

int main(int argc, char** argv) {
  using namespace outrun::cli;
  CLI::App app{"outrun: run untrusted Lua 5.4 scripts out of process"};
  app.require_subcommand(1);
  EvalArgs ea;
  auto* eval = app.add_subcommand("eval", "evaluate one script and print its result");
  eval->add_option("--shards", ea.shards, "worker processes")->check(CLI::Range(1, 64))->capture_default_str();
  eval->add_option("--timeout", ea.timeout_ms, "soft timeout T in ms")->check(CLI::Range(1, 3600000))->capture_default_str();
  eval->add_option("--grace", ea.grace_ms, "grace G in ms before the worker is killed")->check(CLI::Range(0, 3600000))->capture_default_str();
  eval->add_option("--memory-limit", ea.memory_mb, "memory per script state, MB")->check(CLI::Range(1, 65536))->capture_default_str();
  auto* e = eval->add_option("-e,--source", ea.source, "Lua source");
  auto* f = eval->add_option("-f,--file", ea.file, "file with the Lua source");
  e->excludes(f);
  eval->add_option("-i,--input", ea.inputs, "input NAME=VALUE (true, false, nil, numbers, \"strings\", text)");
  eval->add_option("--inputs-json", ea.inputs_json, "inputs as a JSON object");
  eval->add_option("--key", ea.key, "script key (routes it to a shard)")->capture_default_str();
  eval->add_flag("--json", ea.json, "print {status, value, error, shard, latency_us}");
  eval->add_flag("--in-process", ea.in_process, "run in this process (trusted scripts, baseline)");
  int rc = 0;
  eval->callback([&] {
    if (ea.source.empty() && ea.file.empty()) throw CLI::RequiredError("-e SOURCE or -f FILE");
    rc = run_eval(ea);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    return app.exit(err);
  }
  return rc;
}
