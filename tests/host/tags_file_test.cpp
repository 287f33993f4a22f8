// The tags file and updates stream (host/tags/tags_file.h), and `outrun tags run` as a process.
#include "tags_file.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_support.h"

namespace {

using namespace outrun;

std::string parse_error(const std::string& toml) {
  std::vector<tags::TagDefinition> defs;
  std::string err;
  CHECK_FALSE(tags::file::parse_tags(toml, "", &defs, &err));
  return err;
}

std::pair<int, std::string> run_cli(const std::string& args) {
  const std::string cmd =
      std::string("OUTRUN_WORKER=") + OUTRUN_TEST_WORKER + " " + OUTRUN_TEST_CLI + " " + args;
  return outrun::test::run_command(cmd);
}

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = "/tmp/outrun-tags-test-" + std::to_string(getpid()) + "-" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("tags file: every field, and defaults") {
  std::vector<tags::TagDefinition> defs;
  std::string err;
  const char* toml = R"(
[defaults]
type = "Float"
last_usable_ms = 500

[[tag]]
id = "A"
script = "return 1"

[[tag]]
id = "B"
type = "Int32[]"
inputs = ["A", { tag = "S", name = "s", trigger = false, deadband_percent = 5, range = [0, 50] }]
trigger = "periodic"
period_ms = 250
timestamps = "evaluation_time"
keep_state = true
reset_state = true
max_state_bytes = 1000
description = "b"
script = '''
return {1, 2}
'''
)";
  REQUIRE_MESSAGE(tags::file::parse_tags(toml, "", &defs, &err), err);
  REQUIRE(defs.size() == 2);
  CHECK(defs[0].type.type == tags::DataType::Float);
  CHECK(defs[0].last_usable == std::chrono::milliseconds(500));
  CHECK(defs[1].type.type == tags::DataType::Int32);
  CHECK(defs[1].type.array);
  REQUIRE(defs[1].inputs.size() == 2);
  CHECK(defs[1].inputs[0].tag == "A");
  CHECK(defs[1].inputs[1].name == "s");
  CHECK_FALSE(defs[1].inputs[1].trigger);
  CHECK(defs[1].inputs[1].deadband == tags::DeadbandKind::percent);
  CHECK(defs[1].inputs[1].range_high == 50);
  CHECK(defs[1].trigger.kind == tags::TriggerKind::periodic);
  CHECK(defs[1].trigger.period == std::chrono::milliseconds(250));
  CHECK(defs[1].timestamps == tags::TimestampPolicy::evaluation_time);
  CHECK(defs[1].keep_state);
  CHECK(defs[1].reset_state);
  CHECK(defs[1].max_state_bytes == 1000);
}

TEST_CASE("tags file: errors name the line") {
  CHECK(parse_error("[[tag]]\nid = \"A\"\nscript = 1\n").rfind("3:", 0) == 0);
  CHECK(parse_error("[[tag]]\nid = \"A\"\nscript = \"x\"\ncolour = 1\n")
            .find("4:10: unknown key 'colour'") != std::string::npos);
  CHECK(parse_error("[[tag]]\nid = \"A\"\nscript = \"x\"\ntype = \"Double2\"\n")
            .find("unknown DataType") != std::string::npos);
  CHECK(parse_error("[[tag]]\nscript = \"x\"\n").find("needs an `id`") != std::string::npos);
  CHECK(parse_error("[[tag]]\nid = \"A\"\n").find("needs a `script`") != std::string::npos);
  CHECK(parse_error("[[tag]]\nid = \"A\"\nscript = \"x\"\n[[tag]]\nid = \"A\"\nscript = \"y\"\n")
            .find("defined twice") != std::string::npos);
  CHECK(parse_error("[[tag]]\nid = \"A\"\nscript = \"x\"\ntrigger = \"sometimes\"\n")
            .find("trigger") != std::string::npos);
  CHECK(parse_error("[[tag]]\nid = \"A\"\nscript = \"x\"\nperiod_ms = -5\n").find("period_ms") !=
        std::string::npos);
  CHECK(parse_error("[[tag]]\nid = \"A\"\nscript_file = \"x.lua\"\n").find("not allowed") !=
        std::string::npos);
  CHECK(parse_error("[[tag]\nid = \"A\"\n").rfind("1:", 0) ==
        0);  // TOML syntax error, with its line
  CHECK(parse_error("x = 1\n").find("unknown top-level key") != std::string::npos);
}

TEST_CASE("tags updates: one wave per line") {
  tags::file::Wave w;
  std::string err;
  REQUIRE_MESSAGE(
      tags::file::parse_wave(R"({"t": "2026-12-01T10:00:00.500Z", "values": {"T1": {"value": 85.5,
      "status": "UncertainSubstituteValue", "source_time": "2026-12-01T09:59:59Z"}, "T2": 70, "T3": {"a": 1}},
      "trigger": ["M"], "read": ["R"]})",
                             &w, &err),
      err);
  CHECK(w.has_time);
  CHECK(format_datetime(w.time) == "2026-12-01T10:00:00.500Z");
  REQUIRE(w.updates.size() == 3);
  CHECK(w.updates[0].value.value == Value(85.5));
  CHECK(w.updates[0].value.status == tags::codes::UncertainSubstituteValue);
  CHECK(format_datetime(w.updates[0].value.source_time) == "2026-12-01T09:59:59.000Z");
  CHECK(w.updates[1].value.value == Value(int64_t{70}));
  CHECK(w.updates[1].value.status == tags::codes::Good);
  CHECK(w.updates[2].value.value == Value(Map{{"a", Value(int64_t{1})}}));
  CHECK(w.triggers == std::vector<std::string>{"M"});
  CHECK(w.reads == std::vector<std::string>{"R"});
  // Every StatusCode name of the specification, by name.
  REQUIRE_MESSAGE(
      tags::file::parse_wave(R"({"values": {"A": {"value": 1, "status": "BadOutOfService"},
      "B": {"value": 2, "status": "UncertainNoCommunicationLastUsableValue"}}})",
                             &w, &err),
      err);
  REQUIRE(w.updates.size() == 2);
  CHECK(w.updates[0].value.status == 0x808D0000u);
  CHECK(w.updates[1].value.status == 0x408F0000u);
  // Times before 1601 are out of DateTime's range, and say so.
  CHECK_FALSE(tags::file::parse_wave(R"({"t": "1600-12-31T00:00:00Z", "values": {}})", &w, &err));
  CHECK(err.find("range") != std::string::npos);
  CHECK_FALSE(tags::file::parse_wave(
      R"({"values": {"A": {"value": 1, "source_time": "1600-12-31T23:59:59Z"}}})", &w, &err));
  CHECK(err.find("source_time") != std::string::npos);
  CHECK(err.find("range") != std::string::npos);
  for (const char* bad :
       {"[1]", "{\"t\": \"noon\"}", "{\"values\": {\"A\": {\"value\": 1, \"status\": \"Fine\"}}}",
        "{\"values\": 5}", "{\"colour\": 1}", "{\"values\": {\"A\": {\"value\": 1, \"x\": 2}}}",
        "{"}) {
    CAPTURE(bad);
    CHECK_FALSE(tags::file::parse_wave(bad, &w, &err));
    CHECK_FALSE(err.empty());
  }
}

TEST_CASE("outrun tags run: deterministic over workers and in-process, errors with line numbers") {
  const std::string root = OUTRUN_TEST_SOURCE_DIR;
  const std::string args = "tags run -f " + root + "/examples/tags/tank.toml --updates " + root +
                           "/examples/tags/updates.jsonl --json";
  auto a = run_cli(args);
  auto b = run_cli(args + " --shards 2");
  auto c = run_cli(args + " --in-process");
  REQUIRE(a.first == 0);
  CHECK(b.first == 0);
  CHECK(c.first == 0);
  CHECK(a.second == b.second);
  CHECK(a.second == c.second);
  // Every line is a change object; the alarm goes active and the level goes Bad then Good.
  std::istringstream lines(a.second);
  std::string line;
  bool alarm_on = false, level_bad = false, level_good_after = false;
  int n = 0;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    ++n;
    CHECK(j.contains("tag"));
    CHECK(j.contains("status_code"));
    if (j["tag"] == "Tank1.HighAlarm" && j["value"] == true) alarm_on = true;
    if (j["tag"] == "Tank1.Level" && j["status"] == "BadSensorFailure") level_bad = true;
    if (level_bad && j["tag"] == "Tank1.Level" && j["status"] == "Good") level_good_after = true;
  }
  CHECK(n > 20);
  CHECK(alarm_on);
  CHECK(level_bad);
  CHECK(level_good_after);

  const std::string bad_toml =
      write_temp("bad.toml", "[[tag]]\nid = \"A\"\nscript = \"return 1\"\nwhat = 2\n");
  // A broken definition: reported with FILE:LINE:COL, the tag shows BadConfigurationError, the
  // others run, exit 1 at the end; --strict refuses the file (exit 1, nothing runs).
  auto r = run_cli("tags run -f " + bad_toml + " 2>&1");
  CHECK(r.first == 1);
  CHECK(r.second.find(bad_toml + ":4:8: tag 'A': unknown key 'what'") != std::string::npos);
  CHECK(r.second.find("A = nil  BadConfigurationError") != std::string::npos);
  r = run_cli("tags run --strict -f " + bad_toml + " 2>&1");
  CHECK(r.first == 1);
  CHECK(r.second.find(bad_toml + ":4:8: tag 'A': unknown key 'what'") != std::string::npos);
  CHECK(r.second.find("BadConfigurationError") == std::string::npos);
  // The file as a whole unreadable (TOML syntax): exit 2, every error named.
  const std::string syntax = write_temp("syntax.toml", "[[tag]\nid = 1\n");
  r = run_cli("tags run -f " + syntax + " 2>&1");
  CHECK(r.first == 2);
  CHECK(r.second.find(syntax + ":1:") != std::string::npos);

  const std::string ok_toml = write_temp(
      "ok.toml", "[[tag]]\nid = \"A\"\ninputs = [\"S\"]\nscript = \"return inputs.S * 2\"\n");
  const std::string bad_lines =
      write_temp("bad.jsonl", "{\"values\": {\"S\": 1}}\n\n{\"values\": {\"S\": }\n");
  r = run_cli("tags run --in-process -f " + ok_toml + " --updates " + bad_lines + " 2>&1");
  CHECK(r.first == 2);
  CHECK(r.second.find("A = 2") != std::string::npos);  // the first wave ran
  CHECK(r.second.find(bad_lines + ":3: not JSON") != std::string::npos);

  const std::string broken =
      write_temp("broken.toml", "[[tag]]\nid = \"A\"\nscript = \"return (\"\n");
  r = run_cli("tags run -f " + broken + " 2>&1");
  CHECK(r.first == 1);
  CHECK(r.second.find(broken + ":3:1: tag 'A': compile_error: tag:A:1: unexpected symbol at the "
                               "end of the script") != std::string::npos);
  for (const auto& p : {bad_toml, ok_toml, bad_lines, broken, syntax}) std::remove(p.c_str());
}

TEST_CASE("outrun tags run: every error of a file, with FILE:LINE:COL, escaped for a terminal") {
  // Broken tags and two good ones: an unknown DataType, a key with a BEL in it, an id with an
  // ESC (reported, no tag: an id must be printable), and a cycle of two.
  const std::string toml =
      "[[tag]]\nid = \"Good1\"\ninputs = [\"S\"]\nscript = \"return inputs.S + 1\"\n"  // 1-4
      "[[tag]]\nid = \"T1\"\ntype = \"Dobule\"\nscript = \"return 1\"\n"               // 5-8
      "[[tag]]\nid = \"T2\"\n\"be\\u0007l\" = 1\nscript = \"return 1\"\n"              // 9-12
      "[[tag]]\nid = \"T\\u001b[31m3\"\nscript = '''\nlocal x = 1\nreturn (\n'''\n"    // 13-18
      "[[tag]]\nid = \"C1\"\ninputs = [\"C2\"]\nscript = \"return 1\"\n"               // 19-22
      "[[tag]]\nid = \"C2\"\ninputs = [\"C1\"]\nscript = \"return 1\"\n"               // 23-26
      "[[tag]]\nid = \"Good2\"\ninputs = [\"Good1\"]\nscript = \"return inputs.Good1 * 2\"\n";
  const std::string file = write_temp("many.toml", toml);
  const std::string updates = write_temp("many.jsonl", "{\"values\": {\"S\": 1}}\n");
  for (const char* runner : {"", " --in-process"}) {
    CAPTURE(runner);
    auto r = run_cli("tags run -f " + file + " --updates " + updates + runner + " 2>&1");
    CHECK(r.first == 1);
    const std::string& out = r.second;
    CHECK(out.find(file + ":7:8: tag 'T1': type: unknown DataType 'Dobule'") != std::string::npos);
    CHECK(out.find(file + ":11:15: tag 'T2': unknown key 'be\\x07l'") != std::string::npos);
    CHECK(out.find(file + ":13:1: tag 'T\\x1b[31m3': the id contains a control character") !=
          std::string::npos);
    CHECK(out.find("tag 'C1': cycle: C") != std::string::npos);
    CHECK(out.find("tag 'C2': cycle: C") != std::string::npos);
    CHECK(out.find('\x1b') == std::string::npos);  // nothing raw reaches the terminal
    CHECK(out.find('\x07') == std::string::npos);
    // The good tags ran; the broken ones show BadConfigurationError.
    CHECK(out.find("Good1 = 2.0  Good") != std::string::npos);
    CHECK(out.find("Good2 = 4.0  Good") != std::string::npos);
    CHECK(out.find("T1 = nil  BadConfigurationError") != std::string::npos);
    CHECK(out.find("C1 = nil  BadConfigurationError") != std::string::npos);
  }
  // The compile error names the file's own line (a script that is not the last in the file).
  const std::string compile =
      write_temp("compile.toml",
                 "[[tag]]\nid = \"E\"\nscript = '''\nlocal x = 1\nreturn (\n'''\n"
                 "[[tag]]\nid = \"F\"\nscript = '''\nlocal y = 2\ny = = 3\nreturn y\n'''\n");
  auto r = run_cli("tags run --in-process -f " + compile + " 2>&1");
  CHECK(r.first == 1);
  CHECK(r.second.find(compile + ":6:1: tag 'E': compile_error: tag:E:3:") != std::string::npos);
  CHECK(r.second.find(compile + ":11:1: tag 'F': compile_error: tag:F:2:") != std::string::npos);
  for (const auto& p : {file, updates, compile}) std::remove(p.c_str());
}

TEST_CASE("tags file: [[source]] and [[alarm]] declarations, checked, as JSON") {
  const std::string tags = R"(
[[tag]]
id = "Level"
inputs = [{ tag = "Raw", name = "raw" }]
script = "return inputs.raw"

[[tag]]
id = "High"
type = "Boolean"
inputs = ["Level"]
script = "return inputs.Level > 90"
)";
  auto parse = [&](const std::string& more, tags::file::Declarations* d,
                   std::vector<std::string>* errs) {
    std::vector<tags::TagDefinition> defs;
    return tags::file::parse_tags(tags + more, "", "t.toml", &defs, errs, SIZE_MAX, d);
  };
  tags::file::Declarations d;
  std::vector<std::string> errs;
  REQUIRE(parse(R"(
[[source]]
id = "Raw"
type = "Double"
eu_range = [0, 4095]
initial = 0
writable = false
description = "ADC"

[[source]]
id = "Running"
type = "Boolean"

[[source]]
id = "Window"
type = "Int32[]"
initial = [1, 2, 3]

[[alarm]]
id = "Level.Limits"
tag = "Level"
high = 90
low_low = 5
severity = 800
message = "level"

[[alarm]]
id = "High.Alarm"
tag = "High"
)",
                &d, &errs));
  CHECK(errs.empty());
  REQUIRE(d.sources.size() == 3);
  CHECK(d.sources[0].dump() ==
        R"({"id":"Raw","type":"Double","eu_range":[0.0,4095.0],"initial":0.0,"writable":false,)"
        R"("description":"ADC"})");
  CHECK(d.sources[1].dump() == R"({"id":"Running","type":"Boolean","writable":true})");
  CHECK(d.sources[2]["initial"].dump() == "[1,2,3]");
  REQUIRE(d.alarms.size() == 2);
  CHECK(d.alarms[0].dump() ==
        R"({"id":"Level.Limits","tag":"Level","kind":"limit","high":90.0,"low_low":5.0,)"
        R"("severity":800,"message":"level","max_shelved_ms":3600000})");
  // No limits: an off-normal alarm, normal false.
  CHECK(d.alarms[1].dump() ==
        R"({"id":"High.Alarm","tag":"High","kind":"off_normal","normal":false,"severity":500,)"
        R"("max_shelved_ms":3600000})");

  // Each mistake is an error of the file as a whole, with its line.
  const std::pair<const char*, const char*> bad[] = {
      {"[[source]]\nid = \"Raw\"\ntype = \"Double\"\ncolour = 1\n", "unknown key 'colour'"},
      {"[[source]]\nid = \"Level\"\n", "source 'Level' is also a [[tag]]"},
      {"[[source]]\nid = \"Raw\"\n[[source]]\nid = \"Raw\"\n", "declared twice"},
      {"[[source]]\nid = \"Raw\"\ntype = \"Boolean\"\neu_range = [0, 1]\n",
       "eu_range: only for a numeric type"},
      {"[[source]]\nid = \"Raw\"\neu_range = [5, 1]\n", "low < high"},
      {"[[source]]\nid = \"Raw\"\ntype = \"Byte\"\ninitial = 300\n", "outside Byte's range"},
      {"[[source]]\nid = \"Raw\"\neu_range = [0, 10]\ninitial = 11\n", "outside eu_range"},
      {"[[source]]\nid = \"Raw\"\ntype = \"Boolean\"\ninitial = 0\n", "expected true or false"},
      {"[[source]]\ntype = \"Double\"\n", "a source needs an `id`"},
      {"[[alarm]]\nid = \"A\"\ntag = \"Nope\"\nhigh = 1\n", "tag 'Nope' is not a tag"},
      {"[[alarm]]\nid = \"A\"\ntag = \"High\"\nhigh = 1\n", "'High' is Boolean"},
      {"[[alarm]]\nid = \"A\"\ntag = \"Level\"\nhigh = 1\nlow = 2\n", "high is below low"},
      {"[[alarm]]\nid = \"A\"\ntag = \"Level\"\nkind = \"off_normal\"\nhigh = 1\n",
       "limits are for a limit alarm"},
      {"[[alarm]]\nid = \"A\"\ntag = \"Level\"\nseverity = 0\n", "severity: expected an integer"},
      {"[[alarm]]\nid = \"A\"\ntag = \"Level\"\nkind = \"rate\"\n",
       "kind: expected limit or off_normal"},
      {"[[alarm]]\nid = \"A\"\n", "alarm 'A' needs a `tag`"},
  };
  for (const auto& [more, want] : bad) {
    const std::string text = more;
    const std::string expected = want;
    std::vector<std::string> e;
    tags::file::Declarations ignored;
    CAPTURE(text);
    CHECK_FALSE(parse(text, &ignored, &e));
    REQUIRE(!e.empty());
    CHECK_MESSAGE(e[0].find(expected) != std::string::npos, e[0]);
    CHECK(e[0].rfind("t.toml:", 0) == 0);
  }

  {
    std::vector<tags::TagDefinition> defs;
    std::vector<std::string> e;
    CHECK_FALSE(tags::file::parse_tags("source = 1\n" + tags, "", "", &defs, &e));
    REQUIRE(e.size() == 1);
    CHECK(e[0] == "1:10: source: expected [[source]] tables");
  }

  // A DefineTags that is not replace_all merges by id.
  tags::file::Declarations a, b;
  REQUIRE(parse("[[source]]\nid = \"Raw\"\n[[alarm]]\nid = \"X\"\ntag = \"High\"\n", &a, &errs));
  REQUIRE(
      parse("[[source]]\nid = \"Raw\"\ntype = \"Float\"\n[[source]]\nid = \"New\"\n", &b, &errs));
  a.merge(b);
  REQUIRE(a.sources.size() == 2);
  CHECK(a.sources[0]["type"] == "Float");
  CHECK(a.sources[1]["id"] == "New");
  CHECK(a.alarms.size() == 1);
}
