// The outrun command line, run as a real process.
#include <doctest/doctest.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

namespace {

struct Run {
  int code = -1;
  std::string out;  // stdout and stderr, merged
};

Run run_cli(const std::string& args) {
  const std::string cmd = std::string("OUTRUN_WORKER=") + OUTRUN_TEST_WORKER + " " +
                          OUTRUN_TEST_CLI + " " + args + " 2>&1";
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
  Run r = run_cli(
      "eval --json --shards 2 -e 'return { avg = inputs.t / 2, tag = inputs.name }' "
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

namespace {

// stdout only (stderr dropped): what a program reading --json sees.
Run run_cli_stdout(const std::string& args, const std::string& worker = OUTRUN_TEST_WORKER) {
  const std::string cmd =
      "OUTRUN_WORKER=" + worker + " " + OUTRUN_TEST_CLI + " " + args + " 2>/dev/null";
  auto [code, out] = outrun::test::run_command(cmd);
  return Run{code, std::move(out)};
}

// stdout must be exactly one JSON document (one line) with the given status.
nlohmann::json one_document(const Run& r, const std::string& status) {
  INFO("stdout: " << r.out);
  REQUIRE(!r.out.empty());
  CHECK(r.out.back() == '\n');
  CHECK(r.out.find('\n') == r.out.size() - 1);  // one line: no log line mixed in
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  REQUIRE(!j.is_discarded());
  if (!status.empty()) CHECK(j["status"] == status);
  CHECK(j.contains("value"));
  CHECK(j.contains("error"));
  CHECK(j.contains("shard"));
  CHECK(j.contains("latency_us"));
  if (status != "ok") CHECK(j["error"].is_string());
  return j;
}

}  // namespace

TEST_CASE("CLI: --json prints one JSON document on stdout for every outcome") {
  SUBCASE("ok") {
    Run r = run_cli_stdout("eval --json -e 'return 1'");
    CHECK(r.code == 0);
    CHECK(one_document(r, "ok")["value"] == 1);
  }
  SUBCASE("compile_error") {
    Run r = run_cli_stdout("eval --json -e 'return 1 +'");
    CHECK(r.code == 1);
    one_document(r, "compile_error");
  }
  SUBCASE("runtime_error") {
    Run r = run_cli_stdout("eval --json -e 'error(\"boom\")'");
    CHECK(r.code == 1);
    one_document(r, "runtime_error");
  }
  SUBCASE("timeout") {
    Run r = run_cli_stdout("eval --json --timeout 20 --grace 5000 -e 'while true do end'");
    CHECK(r.code == 1);
    one_document(r, "timeout");
  }
  SUBCASE("killed: the worker's death is logged on stderr, never on stdout") {
    Run r = run_cli_stdout(
        "eval --json --timeout 100 --grace 200 "
        "-e 'return ((\"a\"):rep(40000)):find(\".-.-.-.-.-.-b\")'");
    CHECK(r.code == 1);
    one_document(r, "killed");
  }
  SUBCASE("memory_limit") {
    Run r = run_cli_stdout(
        "eval --json --memory-limit 1 -e 'local t = {} for i = 1, 1e7 do t[i] = i end'");
    CHECK(r.code == 1);
    one_document(r, "memory_limit");
  }
  SUBCASE("invalid_argument") {
    Run r = run_cli_stdout("eval --json -e 'return 1' -i novalue");
    CHECK(r.code == 2);
    one_document(r, "invalid_argument");
    r = run_cli_stdout("eval --json -e 'return 1' --inputs-json '[1]'");
    CHECK(r.code == 2);
    one_document(r, "invalid_argument");
    r = run_cli_stdout("eval --json -f /nonexistent.lua");
    CHECK(r.code == 2);
    one_document(r, "invalid_argument");
    // Options for the workers this command starts, with a daemon's socket: refused, not ignored.
    r = run_cli_stdout("--socket /nonexistent/outrund.sock eval --json --timeout 5 -e 'return 1'");
    CHECK(r.code == 2);
    CHECK(one_document(r, "invalid_argument")["error"].get<std::string>().find("--timeout") !=
          std::string::npos);
  }
  SUBCASE("unavailable") {
    Run r = run_cli_stdout("--socket /nonexistent/outrund.sock eval --json -e 'return 1'");
    CHECK(r.code == 3);
    one_document(r, "unavailable");
  }
  SUBCASE("the workers fail to start") {
    for (const char* worker : {"/nonexistent/outrun-worker", "/bin/false"}) {
      CAPTURE(worker);
      Run r = run_cli_stdout("eval --json -e 'return 1'", worker);
      CHECK(r.code == 3);
      const nlohmann::json j = one_document(r, "");
      CHECK(j["status"] != "ok");
      CHECK(j["shard"] == -1);
    }
  }
}

TEST_CASE("CLI: a missing -e/-f exits 2 (usage), as the README says") {
  CHECK(run_cli("eval").code == 2);
  CHECK(run_cli("eval --json").code == 2);
  CHECK(run_cli("frobnicate").code == 2);
  CHECK(run_cli("eval --shards 0 -e 'return 1'").code == 2);
  CHECK(run_cli("--help").code == 0);
}

TEST_CASE("CLI: NaN and infinities have a stated encoding, in JSON and in text") {
  Run r = run_cli_stdout("eval --json -e 'return {0/0, 1/0, -1/0, 1.5}'");
  CHECK(r.code == 0);
  const nlohmann::json j = one_document(r, "ok");
  CHECK(j["value"] == nlohmann::json::parse(R"(["NaN", "Infinity", "-Infinity", 1.5])"));
  r = run_cli_stdout("eval -e 'return {1/0, -1/0}'");
  CHECK(r.code == 0);
  CHECK(r.out == "[inf, -inf]\n");
  r = run_cli_stdout("eval -e 'return 1/0'");
  CHECK(r.out == "inf\n");
  r = run_cli_stdout("eval -e 'return 0/0'");
  CHECK((r.out == "nan\n" || r.out == "-nan\n"));
}

TEST_CASE("CLI: control characters in text output are escaped") {
  Run r = run_cli_stdout("eval -e 'return \"a\\27[31mred\\nline\\0end\"'");
  CHECK(r.code == 0);
  CHECK(r.out == "a\\x1b[31mred\\nline\\x00end\n");
  r = run_cli_stdout("eval -e 'return {[\"k\\27\"] = \"v\\7\"}'");
  CHECK(r.code == 0);
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(r.out.find('\x07') == std::string::npos);
  r = run_cli("eval -e 'error(\"bad\\27[2J\", 0)'");
  CHECK(r.code == 1);
  CHECK(r.out.find('\x1b') == std::string::npos);
}

// README.md's `outrun eval` section names every flag `outrun eval --help` prints (but -h/--help),
// so that the two cannot drift apart.
TEST_CASE("CLI: every flag of eval --help is in README.md's eval section") {
  const Run r = run_cli("eval --help");
  REQUIRE(r.code == 0);
  std::ifstream in(std::string(OUTRUN_TEST_SOURCE_DIR) + "/README.md");
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string readme = ss.str();
  const std::size_t from = readme.find("`outrun eval [");
  REQUIRE(from != std::string::npos);
  const std::size_t to = readme.find("| code | when |", from);
  REQUIRE(to != std::string::npos);
  const std::string section = readme.substr(from, to - from);
  // A flag in the section: not followed by another letter, digit or '-' (--json is not
  // --json-x), not preceded by one (-e is not in --inputs-json... as "-json").
  auto named = [&](const std::string& flag) {
    auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; };
    for (std::size_t at = section.find(flag); at != std::string::npos;
         at = section.find(flag, at + 1)) {
      const bool left = at == 0 || !word(section[at - 1]);
      const std::size_t end = at + flag.size();
      const bool right = end == section.size() || !word(section[end]);
      if (left && right) return true;
    }
    return false;
  };
  std::vector<std::string> flags;
  const std::regex flag_re("(^|[\\s,\\[])(--?[A-Za-z][A-Za-z0-9-]*)");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), flag_re), end; it != end; ++it)
    flags.push_back((*it)[2].str());
  CHECK(flags.size() >= 10);
  for (const std::string& f : flags) {
    if (f == "-h" || f == "--help") continue;
    const std::string why = "README.md's `outrun eval` section lacks " + f;
    CHECK_MESSAGE(named(f), why);
  }
}
