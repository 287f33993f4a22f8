// outrund's crash budget per uid through the real daemon, with real workers that crash on a
// marker (outrun-test-worker's crash-on-source): a client that re-registers a crashing script
// with new bytes each time (a new record: a fresh quarantine count each time) is refused after
// max_crashes_per_uid crashes, for crash_cooldown_ms, while another uid's client goes on; the
// keys are validated with their line (design/daemon.md "Crash budget", issue 29 item 11).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon_support.h"

namespace {

using namespace std::chrono_literals;
using namespace outrun::test;

constexpr uid_t kNobody = 65534;

struct TempConfig {
  std::string path;
  explicit TempConfig(const std::string& text) {
    char tmpl[] = "/tmp/outrund-crash-XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
    std::ofstream(path) << text;
  }
  ~TempConfig() { std::remove(path.c_str()); }
};

// The attacker, as nobody: registers the crashing script under one key with one more comment
// byte each time and evaluates it, until it is refused. Its exit code says what it saw (0: all
// as expected).
int attacker(const std::string& socket) {
  if (setgid(kNobody) != 0 || setuid(kNobody) != 0) return 90;
  outrun::ClientOptions o;
  o.socket = socket;
  o.server_uids = {0};
  std::unique_ptr<outrun::Client> c;
  if (outrun::Client::connect(o, &c)) return 91;
  outrun::Script s, last;
  int crashes = 0;
  for (int i = 0; i < 20; ++i) {
    const outrun::Error e =
        c->register_script("evil", "return 'CRASH-ME' --" + std::string(i, 'x'), &s);
    if (e) {
      // Refused once the budget is spent: a new record is what dodged the quarantine.
      if (e.code != outrun::ErrorCode::unavailable) return 92;
      if (e.message.find("uid 65534 crashed workers 3 times") == std::string::npos) return 93;
      if (e.message.find("daemon.crash_cooldown_ms = 1500") == std::string::npos) return 94;
      break;
    }
    last = s;
    const outrun::Result r = c->evaluate(s, {}).get();
    if (r.status != outrun::Status::worker_lost) return 95;
    ++crashes;
  }
  if (crashes != 3) return 100 + crashes;
  // Its evaluations are refused too, `busy`, naming the cool-down (the last handle's script,
  // which would crash once more).
  const outrun::Result r = c->evaluate(last, {}).get();
  if (r.status != outrun::Status::busy) return 96;
  if (r.error.find("refused for the cool-down") == std::string::npos) return 97;
  // After the cool-down it is served again.
  std::this_thread::sleep_for(1600ms);
  if (c->register_script("fine", "return 7", &s)) return 98;
  if (c->evaluate(s, {}).get().value != outrun::Value(int64_t{7})) return 99;
  return 0;
}

}  // namespace

TEST_CASE("outrund crash budget: a uid crashing workers is refused, another uid is served") {
  if (geteuid() != 0) {
    MESSAGE("not root: needs a second uid; skipped");
    return;
  }
  TempConfig conf(
      "[daemon]\nallowed_uids = [0, 65534]\nsocket_mode = \"0666\"\nmax_crashes_per_uid = 3\n"
      "crash_window_ms = 60000\ncrash_cooldown_ms = 1500\n[host]\nrestart_delay_ms = 1\n"
      "timeout_ms = 5000\ngrace_ms = 5000\n");
  Daemon d({"--config", conf.path, "--worker", OUTRUN_TEST_FAULT_WORKER}, OUTRUN_TEST_DAEMON,
           {"OUTRUN_TEST_FAULT=crash-on-source=CRASH-ME"});
  REQUIRE(chmod(d.dir.c_str(), 0711) == 0);  // nobody may reach the socket
  // nobody's child is forked before this process has threads of its own (TSan refuses threads
  // after a multi-threaded fork).
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(attacker(d.socket));
  // The honest client (root), on both shards, while the attacker runs.
  auto c = d.client();
  std::vector<outrun::Script> honest;
  for (int i = 0; i < 4; ++i) {
    outrun::Script s;
    REQUIRE(!c->register_script("honest." + std::to_string(i), "return inputs.x + 1", &s));
    honest.push_back(s);
  }
  int ok = 0, other = 0, status = 0;
  std::string last_error;
  for (int64_t i = 0; waitpid(pid, &status, WNOHANG) == 0; ++i) {
    const outrun::Result r = c->evaluate(honest[i % 4], {{"x", i}}).get();
    if (r.status == outrun::Status::ok && r.value == outrun::Value(i + 1)) {
      ++ok;
    } else {
      ++other;
      last_error = r.error;
    }
  }
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // attacker() says what it missed
  CHECK(ok > 0);
  CHECK_MESSAGE(other == 0, last_error);
  const nlohmann::json st = d.stats();
  const nlohmann::json& cb = st["crash_budget"];
  MESSAGE("crash_budget: " << cb.dump() << "; honest evaluations ok: " << ok);
  CHECK(cb["crashes_charged"] == 3);
  CHECK(cb["cooldowns"] == 1);
  CHECK(cb["refusals"].get<int>() >= 2);  // a registration and an evaluation
  CHECK(cb["uids_in_cooldown"] == 0);     // over by now
  CHECK(cb["max_crashes_per_uid"] == 3);
  // Root's evaluations are never charged: it evaluates on.
  for (int i = 0; i < 4; ++i)
    CHECK(c->evaluate(honest[i], {{"x", 1}}).get().value == outrun::Value(int64_t{2}));
  CHECK(d.stop() == 0);
}

TEST_CASE(
    "outrund crash budget: its keys are checked, a bad value named with its line and column") {
  struct Bad {
    const char* text;
    const char* error;
  };
  const Bad bad[] = {
      {"[daemon]\nmax_clients = 4\nmax_crashes_per_uid = 0\n",
       ":3:23: daemon.max_crashes_per_uid: expected an integer in [1, 1000000]"},
      {"[daemon]\ncrash_window_ms = -1\n", ":2:19: daemon.crash_window_ms: expected an integer"},
      {"[daemon]\ncrash_cooldown_ms = \"long\"\n",
       ":2:21: daemon.crash_cooldown_ms: expected an integer"},
      {"[host]\nshards = 1\n\ncrash_log_per_second = 0\n",
       ":4:24: host.crash_log_per_second: expected an integer in [1, 1000000]"},
  };
  for (const Bad& b : bad) {
    TempConfig conf(b.text);
    const std::pair<int, std::string> res = run_command(
        std::string(OUTRUN_TEST_DAEMON) + " --check-config --config " + conf.path + " 2>&1");
    CHECK(res.first == 2);
    CHECK_MESSAGE(res.second.find(conf.path + b.error) != std::string::npos, res.second);
  }
  TempConfig good(
      "[daemon]\nmax_crashes_per_uid = 5\ncrash_window_ms = 2000\ncrash_cooldown_ms = 3000\n"
      "[host]\ncrash_log_per_second = 7\n");
  const std::pair<int, std::string> res = run_command(
      std::string(OUTRUN_TEST_DAEMON) + " --check-config --config " + good.path + " 2>&1");
  CHECK(res.first == 0);
  for (const char* line : {"max_crashes_per_uid = 5", "crash_window_ms = 2000",
                           "crash_cooldown_ms = 3000", "crash_log_per_second = 7"})
    CHECK_MESSAGE(res.second.find(line) != std::string::npos, res.second);
}
