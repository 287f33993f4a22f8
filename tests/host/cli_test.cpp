// The outrun command line, run as a real process.
#include <cstdio>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace {

struct Run {
  int code = -1;
  std::string out;  // stdout and stderr, merged
};

Run run_cli(const std::string& args) {
  const std::string cmd = std::string("OUTRUN_WORKER=") + OUTRUN_TEST_WORKER + " " + OUTRUN_TEST_CLI + " " + args + " 2>&1";
  auto [code, out] = outrun::test::run_command(cmd);
  return Run{code, std::move(out)};
}

}  // namespace

TEST_CASE("CLI: eval prints the value and exits 0") {
  Run r = run_cli("eval -e 'return (inputs.a + inputs.b) / 2' -i a=1 -i b=2");
  CHECK(r.code == 0);
  CHECK(r.out == "1.5\n");
  r = run_cli("eval --in-process -e 'return (inputs.a + inputs.b) / 2' -i a=1 -i b=2");
  CHECK(r.code == 0);
  CHECK(r.out == "1.5\n");
}

TEST_CASE("CLI: --json prints status, value, error, shard and latency") {
  Run r = run_cli("eval --json --shards 2 -e 'return { avg = inputs.t / 2, tag = inputs.name }' "
                  "--inputs-json '{\"t\": 5, \"name\": \"Line1\"}'");
  CHECK(r.code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["status"] == "ok");
  CHECK(j["value"] == nlohmann::json::parse(R"({"avg": 2.5, "tag": "Line1"})"));
  CHECK(j["error"].is_null());
  CHECK(j["shard"].get<int>() >= 0);
  CHECK(j["latency_us"].get<int64_t>() > 0);
}

TEST_CASE("CLI: failures print STATUS: message and exit non-zero") {
  Run r = run_cli("eval -e 'return 1 +'");
  CHECK(r.code == 1);
  CHECK(r.out.rfind("compile_error: cli:1:", 0) == 0);
  r = run_cli("eval -e 'local x = nil\nreturn x.y'");
  CHECK(r.code == 1);
  CHECK(r.out.find("runtime_error: cli:2:") != std::string::npos);
  r = run_cli("eval --timeout 20 --grace 5000 -e 'while true do end'");
  CHECK(r.code == 1);
  CHECK(r.out.find("timeout: ") != std::string::npos);
  r = run_cli("eval --json -e 'error(\"boom\")'");
  CHECK(r.code == 1);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["status"] == "runtime_error");
  CHECK(j["error"].get<std::string>().find("boom") != std::string::npos);
}

TEST_CASE("CLI: bad usage is reported, not crashed on") {
  CHECK(run_cli("eval").code != 0);
  CHECK(run_cli("eval -e 'return 1' -i novalue").code == 2);
  CHECK(run_cli("eval -e 'return 1' --inputs-json '[1]'").code == 2);
  CHECK(run_cli("eval -f /nonexistent.lua").code == 2);
  CHECK(run_cli("eval --shards 0 -e 'return 1'").code != 0);
  CHECK(run_cli("frobnicate").code != 0);
}
