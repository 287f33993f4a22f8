// `outrun tags test` as a process: one tag's script run once in a worker with the inputs of the
// command line (host/cli/tags_test_cmd.cpp, design/tags.md "Testing one tag").
#include <doctest/doctest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_support.h"

namespace {

std::pair<int, std::string> run_cli(const std::string& args) {
  const std::string cmd =
      std::string("OUTRUN_WORKER=") + OUTRUN_TEST_WORKER + " " + OUTRUN_TEST_CLI + " " + args;
  return outrun::test::run_command(cmd);
}

// A tags file of the tags these tests run; its path.
std::string tags_file() {
  const std::string path = "/tmp/outrun-tags-test-cmd-" + std::to_string(getpid()) + ".toml";
  std::ofstream(path) << R"(
[[tag]]
id = "Sum"
inputs = [ "a", { tag = "Line.B", name = "b" } ]
script = '''
print("sum of", inputs.a, inputs.b)
log.warn("careful")
return inputs.a + inputs.b
'''

[[tag]]
id = "Line.B"
type = "Int32"
inputs = [ "raw" ]
script = "return inputs.raw"

[[tag]]
id = "Counter"
type = "Int32"
keep_state = true
inputs = [ "x" ]
script = '''
state.n = (state.n or 0) + inputs.x
log.info("n = " .. state.n)
return state.n
'''

[[tag]]
id = "Fails"
inputs = [ "x" ]
script = '''
log.error("about to fail")
local t = nil
return t.field
'''

[[tag]]
id = "Chatty"
type = "Int32"
inputs = []
script = '''
for i = 1, 20 do print("line", i) end
return "many"
'''

[[tag]]
id = "Prev"
inputs = [ "x" ]
script = '''
return (prev and prev.value or 0) + inputs.x, prev and prev.status or nil
'''
)";
  return path;
}

bool has(const std::string& out, const std::string& what) {
  return out.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("outrun tags test: a good evaluation with inputs, its value, times and log lines") {
  const std::string f = tags_file();
  auto r = run_cli("tags test -f " + f +
                   " Sum --inputs-json '{\"a\": 1.5, \"b\": 2}' --now 2026-12-01T10:00:00Z 2>&1");
  INFO(r.second);
  CHECK(r.first == 0);
  CHECK(has(r.second, "tag: Sum\n"));
  CHECK(has(r.second, "input: a = 1.5  Good\n"));
  CHECK(has(r.second, "input: b = 2  Good\n"));
  CHECK(has(r.second, "evaluated: yes\n"));
  CHECK(has(r.second, "decision: evaluated; every input is Good: Good\n"));
  CHECK(has(r.second, "value: 3.5 (Double)\n"));
  CHECK(has(r.second, "status: Good (0x00000000)\n"));
  CHECK(has(r.second, "source time: 2026-12-01T10:00:00.000Z\n"));
  CHECK(has(r.second, "server time: 2026-12-01T10:00:00.000Z\n"));
  CHECK(has(r.second, "diagnostics: (none)\n"));
  CHECK(has(r.second, "log: [info] sum of 1.5 2\n"));
  CHECK(has(r.second, "log: [warning] careful\n"));
  CHECK(has(r.second, "state after: not returned: keep_state = false"));

  // An input's status: the status rule takes the worst input's code.
  r = run_cli("tags test -f " + f +
              " Sum --inputs-json '{\"a\": 1, \"Line.B\": 2}' --status-json "
              "'{\"b\": \"UncertainSubstituteValue\"}' 2>&1");
  INFO(r.second);
  CHECK(r.first == 1);
  CHECK(has(r.second, "value: 3.0 (Double)\n"));
  CHECK(has(r.second, "status: UncertainSubstituteValue (0x40910000)\n"));
  CHECK(has(r.second, "the worst input's status: 'b' is UncertainSubstituteValue"));
  std::remove(f.c_str());
}

TEST_CASE("outrun tags test: keep_state, the state before and after, and prev") {
  const std::string f = tags_file();
  auto r = run_cli("tags test -f " + f +
                   " Counter --inputs-json '{\"x\": 2}' --state-json '{\"n\": 40}' 2>&1");
  INFO(r.second);
  CHECK(r.first == 0);
  CHECK(has(r.second, "value: 42 (Int32)\n"));
  CHECK(has(r.second, "log: [info] n = 42\n"));
  CHECK(has(r.second, "state after: {\"n\":42}\n"));
  // Without --state-json the script starts from {}.
  r = run_cli("tags test -f " + f + " Counter --inputs-json '{\"x\": 2}' 2>&1");
  INFO(r.second);
  CHECK(has(r.second, "state after: {\"n\":2}\n"));

  r = run_cli("tags test -f " + f +
              " Prev --inputs-json '{\"x\": 1}' --prev-json "
              "'{\"value\": 10, \"status\": \"UncertainInitialValue\"}' 2>&1");
  INFO(r.second);
  CHECK(r.first == 1);
  CHECK(has(r.second, "value: 11.0 (Double)\n"));
  CHECK(has(r.second, "status: UncertainInitialValue"));
  CHECK(has(r.second, "the script returned its status"));
  r = run_cli("tags test -f " + f + " Prev --inputs-json '{\"x\": 1}' 2>&1");  // prev is nil
  INFO(r.second);
  CHECK(r.first == 0);
  CHECK(has(r.second, "value: 1.0 (Double)\n"));
  std::remove(f.c_str());
}

TEST_CASE(
    "outrun tags test: a missing input is BadWaitingForInitialData and the script does not "
    "run") {
  const std::string f = tags_file();
  auto r = run_cli("tags test -f " + f + " Sum --inputs-json '{\"a\": 1}' 2>&1");
  INFO(r.second);
  CHECK(r.first == 1);
  CHECK(has(r.second, "input: b = (none)  BadWaitingForInitialData\n"));
  CHECK(has(r.second, "evaluated: no\n"));
  CHECK(has(r.second,
            "decision: not evaluated: input 'b' is BadWaitingForInitialData; the "
            "script did not run"));
  CHECK(has(r.second, "value: (none)\n"));
  CHECK(has(r.second, "status: BadWaitingForInitialData (0x80320000)\n"));
  CHECK_FALSE(has(r.second, "log:"));  // print() never ran
  // A Bad status given for an input: the same rule, with that code.
  r = run_cli("tags test -f " + f +
              " Sum --inputs-json '{\"a\": 1}' --status-json '{\"b\": \"BadSensorFailure\"}' 2>&1");
  INFO(r.second);
  CHECK(r.first == 1);
  CHECK(has(r.second, "status: BadSensorFailure"));
  CHECK(has(r.second, "diagnostics: not evaluated: input 'b' is BadSensorFailure\n"));
  // No input at all: the engine waits for the first one.
  r = run_cli("tags test -f " + f + " Sum 2>&1");
  INFO(r.second);
  CHECK(r.first == 1);
  CHECK(has(r.second, "evaluated: no\n"));
  CHECK(has(r.second, "decision: not evaluated: no input has a value"));
  std::remove(f.c_str());
}

TEST_CASE(
    "outrun tags test: a runtime error is BadInternalError with the error and the log lines") {
  const std::string f = tags_file();
  auto r = run_cli("tags test -f " + f + " Fails --inputs-json '{\"x\": 1}' 2>&1");
  INFO(r.second);
  CHECK(r.first == 1);
  CHECK(has(r.second, "evaluated: yes\n"));
  CHECK(has(r.second, "decision: the script ended runtime_error: BadInternalError\n"));
  CHECK(has(r.second, "status: BadInternalError (0x80020000)\n"));
  CHECK(has(r.second, "diagnostics: runtime_error: tag:Fails:3: attempt to index a nil value"));
  CHECK(has(r.second, "log: [error] about to fail\n"));
  std::remove(f.c_str());
}

TEST_CASE("outrun tags test: the lines over the cap are counted, a result that does not coerce") {
  const std::string f = tags_file();
  auto r = run_cli("tags test -f " + f + " Chatty 2>&1");
  INFO(r.second);
  CHECK(r.first == 1);
  CHECK(has(r.second, "log: [info] line 1\n"));
  CHECK(has(r.second, "log: [info] line 16\n"));
  CHECK_FALSE(has(r.second, "log: [info] line 17\n"));
  CHECK(has(r.second, "log: 4 more lines dropped\n"));
  CHECK(has(r.second, "status: BadTypeMismatch"));
  CHECK(has(r.second, "the result was refused: BadTypeMismatch (expected a number for Int32"));
  std::remove(f.c_str());
}

TEST_CASE("outrun tags test: usage errors exit 2") {
  const std::string f = tags_file();
  auto r = run_cli("tags test -f " + f + " Nope 2>&1");
  INFO(r.second);
  CHECK(r.first == 2);
  CHECK(has(r.second, "no tag 'Nope' in " + f + " (its tags: Sum, Line.B, Counter, Fails, Chatty"));
  r = run_cli("tags test -f " + f + " Sum --inputs-json '{\"a\": ' 2>&1");
  CHECK(r.first == 2);
  CHECK(has(r.second, "--inputs-json: not JSON"));
  r = run_cli("tags test -f " + f + " Sum --inputs-json '{\"c\": 1}' 2>&1");
  CHECK(r.first == 2);
  CHECK(has(r.second, "'c' is not an input of 'Sum' (its inputs: a, b)"));
  r = run_cli("tags test -f " + f + " Sum --inputs-json '{\"b\": \"x\"}' 2>&1");  // Line.B: Int32
  CHECK(r.first == 2);
  CHECK(has(r.second, "input 'b' (Line.B, Int32)"));
  r = run_cli("tags test -f " + f + " Sum --status-json '{\"a\": \"NoSuchCode\"}' 2>&1");
  CHECK(r.first == 2);
  r = run_cli("tags test -f " + f + " Sum --now yesterday 2>&1");
  CHECK(r.first == 2);
  CHECK(has(r.second, "--now: expected an ISO 8601 time"));
  r = run_cli("tags test -f /nonexistent.toml Sum 2>&1");
  CHECK(r.first == 2);
  // --help names every flag.
  r = run_cli("tags test --help 2>&1");
  CHECK(r.first == 0);
  for (const char* flag : {"--file", "--inputs-json", "--status-json", "--state-json",
                           "--prev-json", "--now", "--json", "--timeout"})
    CHECK_MESSAGE(has(r.second, flag), flag);
  std::remove(f.c_str());
}

TEST_CASE("outrun tags test: --json is one object") {
  const std::string f = tags_file();
  auto r = run_cli("tags test --json -f " + f +
                   " Counter --inputs-json '{\"x\": 3}' --now 2026-12-01T10:00:00Z");
  INFO(r.second);
  CHECK(r.first == 0);
  const auto j = nlohmann::json::parse(r.second);
  CHECK(j["tag"] == "Counter");
  CHECK(j["value"] == 3);
  CHECK(j["type"] == "Int32");
  CHECK(j["status"] == "Good");
  CHECK(j["status_code"] == 0);
  CHECK(j["source_time"] == "2026-12-01T10:00:00.000Z");
  CHECK(j["server_time"] == "2026-12-01T10:00:00.000Z");
  CHECK(j["diagnostics"].is_null());
  CHECK(j["evaluated"] == true);
  CHECK(j["outrun_status"] == "ok");
  CHECK(j["decision"].is_string());
  CHECK(j["inputs"]["x"]["value"] == 3);
  CHECK(j["inputs"]["x"]["status"] == "Good");
  REQUIRE(j["logs"].size() == 1);
  CHECK(j["logs"][0]["level"] == "info");
  CHECK(j["logs"][0]["text"] == "n = 3");
  CHECK(j["logs_dropped"] == 0);
  CHECK(j["state_after"] == nlohmann::json{{"n", 3}});

  r = run_cli("tags test --json -f " + f + " Fails --inputs-json '{\"x\": 1}'");
  INFO(r.second);
  CHECK(r.first == 1);
  const auto k = nlohmann::json::parse(r.second);
  CHECK(k["value"].is_null());
  CHECK(k["status"] == "BadInternalError");
  CHECK(k["outrun_status"] == "runtime_error");
  CHECK(k["state_after"].is_null());
  CHECK(k["logs"][0]["level"] == "error");
  std::remove(f.c_str());
}
