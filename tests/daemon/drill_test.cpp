// `outrun drill`: each drill run as an operator would, through the CLI binary against a private
// outrund it starts (or a running one), its --json report checked.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "daemon_support.h"

namespace {

using namespace outrun::test;
using nlohmann::json;

// Runs a drill for 2 s at 300 evaluations/s and returns its report; the exit status must be
// `expect_rc`.
json drill(const std::string& args, int expect_rc = 0) {
  const std::string cmd = std::string(OUTRUN_TEST_CLI) + " " + args + " --json";
  // Not a structured binding: clang 14 cannot capture one (INFO captures `out`).
  const auto [rc, out_] = run_command(cmd);
  const std::string& out = out_;
  INFO(cmd);
  INFO(out);
  REQUIRE(rc == expect_rc);
  json j = json::parse(out, nullptr, false);
  REQUIRE(!j.is_discarded());
  return j;
}

// What every passing report says: everything submitted ended exactly once, the counts add up,
// every ok had its value, the fault happened, every shard served again.
void check_clean(const json& j) {
  INFO(j.dump(2));
  CHECK(j["passed"].get<bool>());
  CHECK(j["lost"].get<int>() == 0);
  CHECK(j["duplicated"].get<int>() == 0);
  CHECK(j["wrong_values"].get<int>() == 0);
  CHECK(j["fault_observed"].get<bool>());
  CHECK(j["recovery_ms"].get<double>() >= 0);
  uint64_t sum = 0;
  for (const auto& [status, n] : j["completed"].items()) sum += n.get<uint64_t>();
  CHECK(sum == j["submitted"].get<uint64_t>());
  CHECK(j["submitted"].get<uint64_t>() > 300);  // the load ran
  CHECK(j["completed"].value("ok", uint64_t{0}) > 300);
  CHECK(j["latency_us"]["before"]["count"].get<int>() > 0);
  CHECK(j["latency_us"]["after"]["count"].get<int>() > 0);
  CHECK(j["daemon_exit"] == "exit 0");
}

const std::string kShort = " --duration 2 --rate 300";

}  // namespace

TEST_CASE("outrun drill kill-one: a worker SIGKILLed under load loses nothing") {
  json j = drill("drill kill-one" + kShort);
  check_clean(j);
  CHECK(j["shards"][0]["death_causes"]["crashed"].get<int>() == 1);
  CHECK(j["shards"][1]["restarts"].get<int>() == 0);
}

TEST_CASE("outrun drill kill-all: every worker SIGKILLed at once loses nothing") {
  json j = drill("drill kill-all --shards 3" + kShort);
  check_clean(j);
  REQUIRE(j["shards"].size() == 4);  // and the slow lane, which the drill kills too
  for (const auto& s : j["shards"]) CHECK(s["death_causes"]["crashed"].get<int>() == 1);
}

TEST_CASE("outrun drill hang: a SIGSTOPped worker is killed for silence and nothing is lost") {
  json j = drill("drill hang" + kShort);
  check_clean(j);
  CHECK(j["shards"][0]["death_causes"]["killed_silence"].get<int>() == 1);
  // Recovery cannot come before the silence limit (2 s by default) has passed since the last
  // heartbeat, which was at most one heartbeat interval (100 ms) before the SIGSTOP.
  CHECK(j["recovery_ms"].get<double>() >= 1900);
}

TEST_CASE("outrun drill runaway: the runaway ends killed, the load does not") {
  json j = drill("drill runaway" + kShort);
  check_clean(j);
  CHECK(j["fault_evaluation"]["status"] == "killed");
  CHECK(j["completed"]["killed"].get<int>() == 1);
  CHECK(j["shards"][0]["death_causes"]["killed_overrun"].get<int>() == 1);
}

TEST_CASE("outrun drill garbage: a worker writing a malformed frame is replaced") {
  json j = drill("drill garbage" + kShort);
  check_clean(j);
  CHECK(j["fault_evaluation"]["status"] == "worker_lost");
  CHECK(j["fault_evaluation"]["error"].get<std::string>().find("violated the protocol") !=
        std::string::npos);
  CHECK(j["shards"][0]["death_causes"]["protocol_violation"].get<int>() == 1);
}

TEST_CASE("outrun drill crash-loop: a shard whose workers die at start comes back") {
  json j = drill("drill crash-loop" + kShort);
  check_clean(j);
  CHECK(j["shards"][0]["death_causes"]["exited"].get<int>() >= 1);
  CHECK(j["shards"][0]["state"] == "running");
  // While the shard was in its crash loop, its evaluations ended unavailable, with the reason.
  CHECK(j["completed"].value("unavailable", 0) > 0);
}

TEST_CASE("outrun drill memory: the memory bomb ends memory_limit and its worker lives on") {
  if (kSanitized) {
    // No RLIMIT_AS under the sanitizers (their shadow memory needs terabytes of address space),
    // so the drill's 1 GiB per-script limit is what stops the bomb, later than its T allows.
    MESSAGE("the memory drill needs the address-space backstop, which sanitizer builds lack");
    return;
  }
  json j = drill("drill memory" + kShort);
  check_clean(j);
  CHECK(j["fault_evaluation"]["status"] == "memory_limit");
  CHECK(j["fault_evaluation"]["error"].get<std::string>().find("backstop") != std::string::npos);
  CHECK(j["shards"][0]["restarts"].get<int>() == 0);
}

TEST_CASE("outrun drill against a running outrund, and what it refuses to do there") {
  Daemon d;
  json j = drill("--socket " + d.socket + " drill kill-one" + kShort);
  INFO(j.dump(2));
  CHECK(j["passed"].get<bool>());
  CHECK(j["lost"].get<int>() == 0);
  CHECK(j["duplicated"].get<int>() == 0);
  CHECK(j["daemon"].get<std::string>().find(d.socket) != std::string::npos);
  CHECK(!j.contains("daemon_exit"));  // not its daemon: it is still serving
  {                                   // and it still serves
    auto c = d.client();
    outrun::Script s;
    REQUIRE(!c->register_script("after.drill", "return 7", &s));
    CHECK(c->evaluate(s, {}).get().value == outrun::Value(int64_t{7}));
  }

  // Drills that need a test fault in the workers are refused: a production daemon has none.
  const auto [rc, out] =
      run_command(std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket + " drill garbage 2>&1");
  CHECK(rc == 2);
  CHECK(out.find("test fault") != std::string::npos);
  // --shards is for the private daemon.
  CHECK(run_command(std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket +
                    " drill kill-one --shards 3 2>&1")
            .first == 2);
  CHECK(run_command(std::string(OUTRUN_TEST_CLI) + " drill no-such-drill 2>&1").first != 0);
  CHECK(run_command(std::string(OUTRUN_TEST_CLI) +
                    " drill kill-one --rate 100000 --duration 600 2>&1")
            .first == 2);  // more evaluations than the drill keeps slots for
  const auto [rc3, out3] =
      run_command(std::string(OUTRUN_TEST_CLI) + " drill kill-one --outrund /nonexistent 2>&1");
  CHECK(rc3 == 3);
  CHECK(out3.find("cannot run outrund") != std::string::npos);
  CHECK(d.stop() == 0);
}

TEST_CASE("outrun drill garbage and crash-loop say so when there is no outrun-test-worker") {
  // An outrun and an outrund with no outrun-test-worker next to them, as in an installed package.
  const std::string dir = temp_dir();
  const std::string cli = dir + "/outrun", daemon = dir + "/outrund";
  std::filesystem::copy_file(OUTRUN_TEST_CLI, cli);
  std::ofstream(daemon) << "#!/bin/sh\nexit 1\n";
  std::filesystem::permissions(daemon, std::filesystem::perms::owner_all);
  for (const char* name : {"garbage", "crash-loop"}) {
    CAPTURE(name);
    const auto run = run_command("env -u OUTRUN_WORKER " + cli + " drill " + name + " --outrund " +
                                 daemon + " 2>&1");
    const int rc = run.first;
    const std::string& out = run.second;
    INFO(out);
    CHECK(rc == 3);
    CHECK(out.find("needs outrun-test-worker") != std::string::npos);
    CHECK(out.find(dir + "/outrun-test-worker") != std::string::npos);
    CHECK(out.find("never installed") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}
