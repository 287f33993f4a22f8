// Integration tests of outrund: the real daemon binary on a temporary socket, real clients.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <flatbuffers/flatbuffers.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon_support.h"
#include "outrun/client.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"

namespace {

using namespace std::chrono_literals;
using namespace outrun::test;
namespace wire = outrun::wire;

std::vector<uint8_t> hello_frame() {
  flatbuffers::FlatBufferBuilder f;
  const auto frame = outrun::protocol::encode_client_hello(f, "test");
  return {frame.begin(), frame.end()};
}

// Reads until the daemon closes the connection; true if it did (within the receive timeout).
bool closed_by_peer(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

void check_client_works(const Daemon& d, const std::string& key) {
  auto c = d.client();
  outrun::Script s;
  REQUIRE(!c->register_script(key, "return inputs.x * 10", &s));
  outrun::Result r = c->evaluate(s, {{"x", 4}}).get();
  REQUIRE(r.status == outrun::Status::ok);
  CHECK(r.value == outrun::Value(int64_t{40}));
}

}  // namespace

TEST_CASE("outrund: 8 concurrent clients get every result right") {
  Daemon d;
  constexpr int kClients = 8, kEach = 300;
  std::atomic<int> wrong{0}, done{0};
  std::vector<std::thread> th;
  for (int t = 0; t < kClients; ++t)
    th.emplace_back([&, t] {
      auto c = d.client();
      outrun::Script s;
      if (c->register_script("client." + std::to_string(t), "return inputs.a * 1000 + inputs.t",
                             &s)) {
        wrong += kEach;
        return;
      }
      // Half one at a time, half as a batch.
      for (int i = 0; i < kEach / 2; ++i) {
        outrun::Result r = c->evaluate(s, {{"a", i}, {"t", t}}).get();
        if (r.status != outrun::Status::ok || !(r.value == outrun::Value(int64_t{i} * 1000 + t)))
          ++wrong;
        ++done;
      }
      // A batch of one key would be refused by single flight: one key per request.
      std::vector<outrun::Script> keys(kEach / 2);
      for (int i = 0; i < kEach / 2; ++i)
        if (c->register_script("client." + std::to_string(t) + "." + std::to_string(i),
                               "return inputs.a * 1000 + inputs.t", &keys[i]))
          ++wrong;
      std::vector<outrun::Request> batch;
      for (int i = 0; i < kEach / 2; ++i)
        batch.push_back(outrun::Request{keys[i], {{"a", i}, {"t", t}}});
      std::promise<void> all;
      std::atomic<int> left{kEach / 2};
      c->evaluate_batch(std::move(batch), [&](std::size_t i, outrun::Result r) {
        if (r.status != outrun::Status::ok || !(r.value == outrun::Value(int64_t(i) * 1000 + t)))
          ++wrong;
        ++done;
        if (--left == 0) all.set_value();
      });
      all.get_future().wait();
    });
  for (auto& x : th) x.join();
  CHECK(wrong.load() == 0);
  CHECK(done.load() == kClients * kEach);
  const auto st = d.stats();
  CHECK(st["evaluations"]["ok"].get<int>() == kClients * kEach);
  CHECK(st["inflight"].get<int>() == 0);
  CHECK(d.stop() == 0);
}

TEST_CASE(
    "outrund: garbage or an oversized frame or a mid-batch disconnect affects only its client") {
  Daemon d;
  auto good = d.client();
  outrun::Script s;
  REQUIRE(!good->register_script("good", "return inputs.x + 1", &s));
  REQUIRE(good->evaluate(s, {{"x", 1}}).get().status == outrun::Status::ok);

  SUBCASE("garbage") {
    int fd = connect_raw(d.socket);
    const char junk[] = "\x10\x00\x00\x00this is not a flatbuffer at all";
    REQUIRE(write(fd, junk, sizeof junk) > 0);
    CHECK(closed_by_peer(fd));
    close(fd);
  }
  SUBCASE("garbage after a valid hello") {
    int fd = connect_raw(d.socket);
    auto h = hello_frame();
    REQUIRE(write(fd, h.data(), h.size()) == static_cast<ssize_t>(h.size()));
    const char junk[] =
        "\x20\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"
        "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff";
    REQUIRE(write(fd, junk, sizeof junk - 1) > 0);
    CHECK(closed_by_peer(fd));
    close(fd);
  }
  SUBCASE("oversized frame") {
    int fd = connect_raw(d.socket);
    auto h = hello_frame();
    REQUIRE(write(fd, h.data(), h.size()) == static_cast<ssize_t>(h.size()));
    const uint32_t len = outrun::protocol::kMaxFrameSize + 1;
    uint8_t prefix[4] = {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)};
    REQUIRE(write(fd, prefix, 4) == 4);
    CHECK(closed_by_peer(fd));
    close(fd);
  }
  SUBCASE("a frame that is not a client frame") {
    int fd = connect_raw(d.socket);
    auto h = hello_frame();
    REQUIRE(write(fd, h.data(), h.size()) == static_cast<ssize_t>(h.size()));
    flatbuffers::FlatBufferBuilder f;
    const auto frame = outrun::protocol::encode_shutdown(f);
    REQUIRE(write(fd, frame.data(), frame.size()) == static_cast<ssize_t>(frame.size()));
    CHECK(closed_by_peer(fd));
    close(fd);
  }
  SUBCASE("disconnect mid-batch") {
    for (int round = 0; round < 3; ++round) {
      auto c = d.client();
      std::vector<outrun::Script> keys(500);
      for (int i = 0; i < 500; ++i)
        REQUIRE(!c->register_script(
            "flood." + std::to_string(i),
            "local x = 0 for i = 1, 20000 do x = x + i end return x + inputs.i", &keys[i]));
      std::vector<outrun::Request> batch;
      for (int i = 0; i < 500; ++i) batch.push_back(outrun::Request{keys[i], {{"i", i}}});
      std::atomic<int> called{0};
      c->evaluate_batch(std::move(batch), [&](std::size_t, outrun::Result) { ++called; });
      c.reset();                    // gone with most of its batch in flight
      CHECK(called.load() == 500);  // every callback ran exactly once (cancelled locally)
    }
  }
  // The good client and new clients are unaffected; nothing stays in flight.
  for (int i = 0; i < 5; ++i) {
    outrun::Result r = good->evaluate(s, {{"x", i}}).get();
    REQUIRE(r.status == outrun::Status::ok);
    CHECK(r.value == outrun::Value(int64_t{i} + 1));
  }
  check_client_works(d, "fresh");
  nlohmann::json st;
  for (int i = 0; i < 1000; ++i) {
    st = d.stats();
    if (st["inflight"].get<int>() == 0 && st["clients"].get<int>() == 2)
      break;  // good + the stats client
    std::this_thread::sleep_for(10ms);
  }
  CHECK(st["inflight"].get<int>() == 0);
  CHECK(st["clients"].get<int>() == 2);
  good.reset();
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund: a uid that is not allowed is refused") {
  Daemon d({"--allow-uid", "4242", "--allow-gid", "4242"});
  outrun::ClientOptions o;
  o.socket = d.socket;
  std::unique_ptr<outrun::Client> c;
  outrun::Error e = outrun::Client::connect(o, &c);
  CHECK(e.code == outrun::ErrorCode::unavailable);
  CHECK(e.message.find("permission denied") != std::string::npos);
  CHECK(!c);
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund: SIGTERM drains in-flight evaluations and exits 0 with no worker left") {
  Daemon d({"--timeout", "20000", "--grace", "1000"});
  auto c = d.client();
  const auto st = d.stats();
  std::vector<int> workers;
  for (const auto& s : st["shards"]) workers.push_back(s["pid"].get<int>());
  REQUIRE(workers.size() == 3);  // two shards and the slow lane
  for (int w : workers) REQUIRE(process_alive(w));

  constexpr int kN = 6;
  std::vector<outrun::Script> keys(kN);
  for (int i = 0; i < kN; ++i)
    REQUIRE(!c->register_script(
        "slow." + std::to_string(i),
        "local x = 0 for i = 1, 3000000 do x = x + 1 end return x + inputs.i", &keys[i]));
  std::vector<outrun::Future> fs;
  for (int i = 0; i < kN; ++i) fs.push_back(c->evaluate(keys[i], {{"i", i}}));
  // Once the daemon has them all in flight, stop it.
  for (int i = 0; i < 2000; ++i) {
    if (d.stats()["inflight"].get<int>() == kN) break;
    std::this_thread::sleep_for(1ms);
  }
  kill(d.pid, SIGTERM);
  for (int i = 0; i < kN; ++i) {
    outrun::Result r = fs[i].get();
    INFO(r.error);
    CHECK(r.status == outrun::Status::ok);
    CHECK(r.value == outrun::Value(int64_t{3000000} + i));
  }
  CHECK(d.stop() == 0);
  for (int w : workers) CHECK(!process_alive(w));
  CHECK(!can_connect(d.socket));
}

// The drain deadline passes with evaluations still running: the Host is destroyed with them in
// flight, and their last callbacks (cancelled) run while it is (found by review: a callback that
// used the daemon's Host pointer then crashed the daemon at exit).
TEST_CASE("outrund: SIGTERM past the drain deadline with evaluations running still exits 0") {
  Daemon d({"--timeout", "20000", "--grace", "1000", "--drain-timeout", "0"});
  auto c = d.client();
  constexpr int kN = 4;
  std::vector<outrun::Script> keys(kN);
  for (int i = 0; i < kN; ++i)
    REQUIRE(!c->register_script("spin." + std::to_string(i), "while true do end", &keys[i]));
  std::vector<outrun::Future> fs;
  for (int i = 0; i < kN; ++i) fs.push_back(c->evaluate(keys[i], {}));
  for (int i = 0; i < 2000; ++i) {
    if (d.stats()["inflight"].get<int>() == kN) break;
    std::this_thread::sleep_for(1ms);
  }
  CHECK(d.stop() == 0);
  for (auto& f : fs) CHECK(f.get().status != outrun::Status::ok);  // the connection went
}

TEST_CASE("outrund: outrun stats --prometheus is Prometheus text and kill-shard restarts a shard") {
  Daemon d;
  check_client_works(d, "prom");
  auto run = [&](const std::string& args) {
    const std::string cmd = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket + " " + args;
    const auto [rc, out] = run_command(cmd);
    INFO(cmd);
    REQUIRE(rc == 0);
    return out;
  };
  REQUIRE(run("kill-shard 0").find("killed shard 0") != std::string::npos);
  nlohmann::json st;
  for (int i = 0; i < 1000; ++i) {
    st = nlohmann::json::parse(run("shards --json"));
    if (st["shards"][0]["restarts"].get<int>() >= 1 && st["shards"][0]["state"] == "running") break;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(st["shards"][0]["restarts"].get<int>() >= 1);
  CHECK(st["shards"][0]["death_causes"]["killed_requested"].get<int>() == 1);

  const std::string text = run("stats --prometheus");
  // The text exposition format, line by line.
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .*)");
  static const std::regex type(
      R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|summary|histogram|untyped))");
  static const std::regex sample(
      R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*\})? ([-+]?([0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?|NaN|\+Inf|-Inf)))");
  std::set<std::string> typed;
  std::map<std::string, std::string> type_of;
  std::set<std::string> sample_names;
  std::istringstream is(text);
  std::string line;
  int samples = 0;
  while (std::getline(is, line)) {
    std::smatch m;
    INFO(line);
    if (line.empty()) continue;
    if (std::regex_match(line, m, help)) continue;
    if (std::regex_match(line, m, type)) {
      CHECK(typed.insert(m[1]).second);  // one TYPE per family
      type_of[m[1]] = m[2];
      continue;
    }
    REQUIRE(std::regex_match(line, m, sample));
    std::string name = m[1];
    std::string family = name;
    for (const char* suffix : {"_sum", "_count"})
      if (!type_of.count(family) && family.size() > std::strlen(suffix) &&
          family.compare(family.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
        family = family.substr(0, family.size() - std::strlen(suffix));
    CHECK(type_of.count(family) == 1);  // TYPE comes before the family's samples
    ++samples;
    sample_names.insert(name);
  }
  CHECK(samples > 20);
  for (const char* n : {"outrun_up", "outrun_evaluations_total", "outrun_shard_up",
                        "outrun_shard_restarts_total", "outrun_evaluation_latency_seconds",
                        "outrun_evaluation_latency_seconds_count", "outrun_shard_rss_bytes",
                        "outrun_shard_uptime_seconds", "outrun_shard_evaluation_latency_seconds"})
    CHECK(sample_names.count(n) == 1);
  CHECK(text.find("outrun_evaluations_total{status=\"ok\"} 1\n") != std::string::npos);

  const std::string scripts = run("scripts --json");
  const auto sj = nlohmann::json::parse(scripts);
  REQUIRE(sj["scripts"].size() == 1);
  CHECK(sj["scripts"][0]["key"] == "prom");
  CHECK(sj["scripts"][0]["sha256"].get<std::string>().size() == 64);
  CHECK(sj["scripts"][0]["evaluations"] == 1);
  CHECK(run("eval -e 'return inputs.a + 1' -i a=41") == "42\n");
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund --check-config reads TOML and rejects unknown keys") {
  const std::string dir = temp_dir();
  const std::string good = dir + "/good.toml", bad = dir + "/bad.toml";
  std::ofstream(good)
      << "[daemon]\nsocket = \"" << dir
      << "/s.sock\"\nsocket_mode = \"0600\"\nallowed_uids = [0, 1000]\n"
      << "[host]\nshards = 3\ntimeout_ms = 250\nsingle_flight = \"coalesce_latest\"\n";
  std::ofstream(bad) << "[host]\nshard = 3\n";
  auto run = [](const std::string& args, int* rc) {
    auto [code, out] = run_command(std::string(OUTRUN_TEST_DAEMON) + " " + args + " 2>&1");
    *rc = code;
    return out;
  };
  int rc = 0;
  std::string out = run("--check-config --config " + good + " --shards 4", &rc);
  CHECK(rc == 0);
  CHECK(out.find("shards = 4") != std::string::npos);  // the flag overrides the file
  CHECK(out.find("timeout_ms = 250") != std::string::npos);
  CHECK(out.find("socket_mode = '0600'") != std::string::npos);
  CHECK(out.find("coalesce_latest") != std::string::npos);
  out = run("--check-config --config " + bad, &rc);
  CHECK(rc == 2);
  CHECK(out.find("unknown key host.shard") != std::string::npos);
  // Each value in range, the whole not: the Host's own rules (outrun::validate) reject it, at
  // --check-config already, not at start.
  const std::string bad_host = dir + "/bad_host.toml";
  std::ofstream(bad_host) << "[host]\nheartbeat_interval_ms = 500\nsilence_limit_ms = 400\n";
  out = run("--check-config --config " + bad_host, &rc);
  CHECK(rc == 2);
  CHECK_MESSAGE(
      out.find("heartbeat_interval must be positive and below silence_limit") != std::string::npos,
      out);
  std::ofstream(bad_host) << "[host]\nretries = 50\n";
  out = run("--check-config --config " + bad_host, &rc);
  CHECK(rc == 2);
  CHECK_MESSAGE(out.find("retries must be 0..10") != std::string::npos, out);
  // A value's error names its line and column; a missing file says so.
  std::ofstream(bad_host) << "[daemon]\nlog_level = \"info\"\n\n[host]\nshards = 0\n";
  out = run("--check-config --config " + bad_host, &rc);
  CHECK(rc == 2);
  CHECK_MESSAGE(
      out.find("bad_host.toml:5:10: host.shards: expected an integer") != std::string::npos, out);
  out = run("--check-config --config " + dir + "/missing.toml", &rc);
  CHECK(rc == 2);
  CHECK_MESSAGE(out.find("missing.toml: No such file or directory") != std::string::npos, out);
  // What the file names outside itself: a group nobody has, a log in a directory that does not
  // exist (never created: a typo as root must not make directories). Both, at once.
  std::ofstream(bad_host) << "[daemon]\nsocket_group = \"no-such-group-outrun\"\nlog_file = \""
                          << dir << "/nodir/outrund.log\"\n";
  out = run("--check-config --config " + bad_host, &rc);
  CHECK(rc == 2);
  CHECK_MESSAGE(out.find("no group named 'no-such-group-outrun'") != std::string::npos, out);
  CHECK_MESSAGE(out.find("nodir: No such file or directory") != std::string::npos, out);
  out = run("--config " + bad_host + " --socket " + dir + "/x.sock", &rc);  // start: the same
  CHECK(rc == 2);
  CHECK(access((dir + "/nodir").c_str(), F_OK) != 0);
  // The tags file: every error of the file and every script that does not compile, with
  // FILE:LINE:COL; a missing one is an error.
  const std::string tags = dir + "/tags.toml";
  std::ofstream(tags) << "[[tag]]\nid = \"A\"\ninputs = [\"x\"]\nscript = \"return inputs.x +\"\n"
                      << "[[tag]]\nid = \"B\"\ninputs = [\"x\"]\nscript = \"return 1\"\n"
                      << "[[tag]]\nid = \"C\"\ntype = \"Nope\"\ninputs = [\"x\"]\n"
                      << "script = \"return 1\"\n";
  out = run("--check-config --tags " + tags, &rc);
  CHECK(rc == 2);
  CHECK_MESSAGE(out.find("tags.toml:4:") != std::string::npos, out);   // A's script
  CHECK_MESSAGE(out.find("tags.toml:11:") != std::string::npos, out);  // C's type
  out = run("--check-config --tags " + dir + "/none.toml", &rc);
  CHECK(rc == 2);
  CHECK_MESSAGE(out.find("none.toml") != std::string::npos, out);
  std::ofstream(tags) << "[[tag]]\nid = \"B\"\ninputs = [\"x\"]\nscript = \"return 1\"\n";
  out = run("--check-config --tags " + tags, &rc);
  CHECK_MESSAGE(rc == 0, out);
  // Usage errors exit 2 (not CLI11's 100+); --version answers.
  out = run("--no-such-flag", &rc);
  CHECK(rc == 2);
  out = run("--version", &rc);
  CHECK(rc == 0);
  CHECK(out.find("outrund ") == 0);
  std::remove(tags.c_str());
  std::remove(bad_host.c_str());
  std::remove(good.c_str());
  std::remove(bad.c_str());
  rmdir(dir.c_str());
}

TEST_CASE(
    "outrund: evaluations beyond max_inflight_per_client are answered busy and others go on") {
  Daemon d({"--max-inflight-per-client", "8", "--timeout", "20000"});
  auto c = d.client();
  constexpr int kN = 64;
  std::vector<outrun::Script> keys(kN);
  for (int i = 0; i < kN; ++i)
    REQUIRE(!c->register_script("limit." + std::to_string(i),
                                "local x = 0 for i = 1, 200000 do x = x + 1 end return x",
                                &keys[i]));
  std::vector<outrun::Request> batch;
  for (int i = 0; i < kN; ++i) batch.push_back(outrun::Request{keys[i], {}});
  std::mutex mu;
  std::map<outrun::Status, int> by;
  std::string busy_msg;
  std::promise<void> all;
  std::atomic<int> left{kN};
  c->evaluate_batch(std::move(batch), [&](std::size_t, outrun::Result r) {
    {
      std::lock_guard lock(mu);
      ++by[r.status];
      if (r.status == outrun::Status::busy) busy_msg = r.error;
    }
    if (--left == 0) all.set_value();
  });
  all.get_future().wait();
  CHECK(by[outrun::Status::ok] == 8);  // one frame: the first 8 accepted, the rest refused at once
  CHECK(by[outrun::Status::busy] == kN - 8);
  CHECK(busy_msg.find("max_inflight_per_client") != std::string::npos);
  check_client_works(d, "after.limit");
  CHECK(d.stop() == 0);
}

TEST_CASE("outrun::Client: a daemon that dies ends what is in flight `unavailable`") {
  Daemon d({"--timeout", "20000"});
  auto c = d.client();
  outrun::Script s;
  REQUIRE(
      !c->register_script("die", "local x = 0 for i = 1, 50000000 do x = x + 1 end return x", &s));
  auto f = c->evaluate(s, {});
  kill(d.pid, SIGKILL);
  waitpid(d.pid, nullptr, 0);
  d.pid = -1;
  outrun::Result r = f.get();
  CHECK(r.status == outrun::Status::unavailable);
  CHECK(!c->connected());
  CHECK(c->evaluate(s, {}).get().status == outrun::Status::unavailable);
  std::string js;
  CHECK(c->stats_json(&js).code == outrun::ErrorCode::unavailable);
}

TEST_CASE("outrund: SIGHUP reopens the log file") {
  const std::string dir = temp_dir();
  const std::string log = dir + "/outrund.log", rotated = dir + "/outrund.log.1";
  {
    Daemon d({"--log-file", log, "--log-level", "info"});
    REQUIRE(std::rename(log.c_str(), rotated.c_str()) == 0);  // logrotate
    kill(d.pid, SIGHUP);
    for (int i = 0; i < 1000; ++i) {
      if (access(log.c_str(), F_OK) == 0) break;
      std::this_thread::sleep_for(5ms);
    }
    CHECK(access(log.c_str(), F_OK) == 0);
    CHECK(d.stop() == 0);
  }
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(ss.str().find("outrund stopped") != std::string::npos);
  std::remove(log.c_str());
  std::remove(rotated.c_str());
  rmdir(dir.c_str());
}

TEST_CASE("outrund: a script key that is not UTF-8 does not end the daemon at `scripts`") {
  // Found by fuzz_daemon_client: json::dump threw on the loop thread and ended outrund.
  Daemon d;
  auto c = d.client();
  outrun::Script s;
  REQUIRE(!c->register_script("bad\xff\xfekey", "return 1", &s));
  std::string doc;
  REQUIRE(!c->scripts_json(&doc));
  const auto j = nlohmann::json::parse(doc);
  bool found = false;
  for (const auto& e : j["scripts"]) {
    if (e["key"] != "bad\xEF\xBF\xBD\xEF\xBF\xBDkey") continue;
    found = true;
    CHECK(e["crashes"] == 0);  // the host's crash attribution, per script record
    CHECK(e["quarantined"] == false);
  }
  CHECK(found);  // each invalid byte became U+FFFD
  CHECK(c->evaluate(s, {}).get().status == outrun::Status::ok);
  check_client_works(d, "after.bad.key");
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund: registrations past max_script_bytes_mb are refused, the daemon goes on") {
  const std::string dir = temp_dir();
  const std::string config = dir + "/outrund.toml";
  // The registry's own limit, not the per-uid quota (half of it by default): the quota as large.
  std::ofstream(config) << "[daemon]\nmax_registry_bytes_per_uid = 1048576\n"
                           "[host]\nmax_script_bytes_mb = 1\n";
  Daemon d({"--config", config});
  auto c = d.client();
  std::string big = "return 1 --";
  big.resize(600 << 10, 'x');
  outrun::Script a, b;
  REQUIRE(!c->register_script("big.a", big, &a));
  const outrun::Error e = c->register_script("big.b", big, &b);
  CHECK(e.code == outrun::ErrorCode::unavailable);
  CHECK(e.message.find("max_script_bytes") != std::string::npos);
  CHECK(c->evaluate(a, {}).get().value == outrun::Value(int64_t{1}));
  check_client_works(d, "after.full");
  CHECK(d.stop() == 0);
  std::remove(config.c_str());
  rmdir(dir.c_str());
}

TEST_CASE(
    "outrund: a frame whose inputs use one subtree thousands of times is refused, not decoded") {
  // 2,100 inputs, every one the same 8 KiB string: a 25 KB frame that stands for 17 MiB of
  // values. The daemon refuses it while decoding (the frame's budget is the frame size limit),
  // says why, and the connection goes on.
  Daemon d;
  auto c = d.client();
  outrun::Script s;
  REQUIRE(!c->register_script("shared.inputs", "return 1", &s));
  const int fd = connect_raw(d.socket);
  const auto hello = hello_frame();
  REQUIRE(write(fd, hello.data(), hello.size()) == static_cast<ssize_t>(hello.size()));
  auto evaluate = [&](uint64_t id, int inputs) {
    flatbuffers::FlatBufferBuilder f;
    auto str = f.CreateString(std::string(8192, 'x'));
    auto value = wire::CreateValue(f, wire::ValueKind::String, false, 0, 0.0, str);
    std::vector<flatbuffers::Offset<wire::Input>> ins;
    for (int i = 0; i < inputs; ++i)
      ins.push_back(wire::CreateInput(f, f.CreateString("i" + std::to_string(i)), value));
    auto ev = outrun::protocol::build_evaluation(f, id, s.id(), 0, f.CreateVector(ins), nullptr);
    const auto frame = outrun::protocol::finish_evaluate(f, {&ev, 1});
    REQUIRE(write(fd, frame.data(), frame.size()) == static_cast<ssize_t>(frame.size()));
  };
  evaluate(1, 2100);
  evaluate(2, 3);  // a next frame has its own budget
  outrun::protocol::FrameReader reader;
  std::map<uint64_t, std::pair<wire::Status, std::string>> got;
  while (got.size() < 2) {
    REQUIRE(reader.read_from(fd) > 0);
    outrun::protocol::FrameView fv;
    while (reader.next(fv)) {
      if (fv.frame->body_type() != wire::Body::Results) continue;
      for (const wire::Result* r : *fv.frame->body_as_Results()->items())
        got[r->id()] = {r->status(), r->error() ? r->error()->str() : ""};
    }
  }
  CHECK(got[1].first == wire::Status::InvalidArgument);
  CHECK(got[1].second.find("decode to more than 16777216 bytes") != std::string::npos);
  CHECK(got[2].first == wire::Status::Ok);
  close(fd);
  check_client_works(d, "after.shared");
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund: unregister through outrun::Client and outrun unregister, memory comes back") {
  Daemon d;
  auto c = d.client();
  auto other = d.client();
  outrun::Script s, seen;
  REQUIRE(!c->register_script("unreg.k", "return 5", &s));
  REQUIRE(!other->register_script("unreg.k", "return 5", &seen));  // the same handle
  CHECK(c->evaluate(s, {}).get().value == outrun::Value(int64_t{5}));
  const auto before = d.stats();
  REQUIRE(before.contains("registry"));
  CHECK(before["registry"]["scripts"].get<int>() >= 1);
  REQUIRE(before.contains("compiler"));
  CHECK(before["compiler"]["pid"].get<int>() > 0);  // the compile-only process runs
  CHECK(!c->unregister_script("unreg.k"));
  // This client knows at once; another one learns it from the daemon.
  outrun::Result r = c->evaluate(s, {}).get();
  CHECK(r.status == outrun::Status::invalid_argument);
  CHECK(r.error == "script 'unreg.k' was unregistered");
  r = other->evaluate(seen, {}).get();
  CHECK(r.status == outrun::Status::invalid_argument);
  CHECK(r.error == "script 'unreg.k' was unregistered");
  // Unknown keys.
  outrun::Error e = c->unregister_script("unreg.k");
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK(e.message.find("unreg.k") != std::string::npos);
  CHECK(c->unregister_script("never.registered").code == outrun::ErrorCode::invalid_argument);
  // The key registers again, with a new handle.
  outrun::Script again;
  REQUIRE(!c->register_script("unreg.k", "return 6", &again));
  CHECK(c->evaluate(again, {}).get().value == outrun::Value(int64_t{6}));
  CHECK(other->evaluate(seen, {}).get().status == outrun::Status::invalid_argument);

  // 300 cycles: the daemon's registry is back where it was, and so are its workers.
  const auto base = d.stats();
  for (int i = 0; i < 300; ++i) {
    const std::string key = "unreg.cycle." + std::to_string(i);
    outrun::Script x;
    REQUIRE(!c->register_script(key, "return " + std::to_string(i), &x));
    REQUIRE(c->evaluate(x, {}).get().value == outrun::Value(int64_t{i}));
    REQUIRE(!c->unregister_script(key));
  }
  const auto after = d.stats();
  CHECK(after["registry"] == base["registry"]);
  CHECK(after["scripts"] == base["scripts"]);
  auto worker_scripts = [](const nlohmann::json& j) {
    int64_t n = 0;
    for (const auto& sh : j["shards"]) n += sh["worker_scripts"].get<int64_t>();
    return n;
  };
  bool back = false;
  for (int i = 0; i < 2000 && !back; ++i) {
    back = worker_scripts(d.stats()) == worker_scripts(base);
    if (!back) std::this_thread::sleep_for(10ms);
  }
  CHECK(back);

  // The command line.
  const std::string cli = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket;
  auto [rc, out] = run_command(cli + " unregister unreg.k 2>&1");
  CHECK(rc == 0);
  CHECK(out.find("unregistered unreg.k") != std::string::npos);
  std::tie(rc, out) = run_command(cli + " unregister unreg.k 2>&1");
  CHECK(rc != 0);
  CHECK(out.find("invalid_argument") != std::string::npos);
  CHECK(c->evaluate(again, {}).get().status == outrun::Status::invalid_argument);
  check_client_works(d, "after.unregister");
  CHECK(d.stop() == 0);
}

namespace {

// A raw connection to outrund, for what outrun::Client does not show: pipelined registrations
// by the hundred thousand, and the ListScripts reply frames themselves (their sizes).
struct RawClient {
  int fd;
  outrun::protocol::FrameReader reader;
  uint64_t next_id = 1;
  explicit RawClient(const std::string& socket) : fd(connect_raw(socket)) {
    send(hello_frame());
    REQUIRE(next().frame->body_type() == wire::Body::ServerHello);
  }
  ~RawClient() { close(fd); }
  void send(const std::vector<uint8_t>& b) {
    for (std::size_t off = 0; off < b.size();) {
      const ssize_t n = write(fd, b.data() + off, b.size() - off);
      REQUIRE(n > 0);
      off += static_cast<std::size_t>(n);
    }
  }
  outrun::protocol::FrameView next() {  // valid until the next call
    outrun::protocol::FrameView fv;
    while (!reader.next(fv)) REQUIRE(reader.read_from(fd) > 0);
    return fv;
  }
};

// Registers key(0..n-1) with `source`, pipelined (a writer thread, 1,000 frames per write);
// every one must be Ok. Returns the seconds it took.
template <typename KeyFn>
double register_many(const Daemon& d, int n, KeyFn key, const std::string& source) {
  RawClient rc(d.socket);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread writer([&] {
    flatbuffers::FlatBufferBuilder f;
    std::vector<uint8_t> buf;
    for (int i = 0; i < n; ++i) {
      f.Clear();
      const auto frame =
          outrun::protocol::encode_register(f, static_cast<uint64_t>(i), key(i), source);
      buf.insert(buf.end(), frame.begin(), frame.end());
      if (buf.size() > (64 << 10) || i + 1 == n) {
        for (std::size_t off = 0; off < buf.size();) {
          const ssize_t w = write(rc.fd, buf.data() + off, buf.size() - off);
          if (w <= 0) return;
          off += static_cast<std::size_t>(w);
        }
        buf.clear();
      }
    }
  });
  int ok = 0;
  std::string first_error;
  for (int got = 0; got < n; ++got) {
    const auto fv = rc.next();
    REQUIRE(fv.frame->body_type() == wire::Body::Registered);
    const auto* r = fv.frame->body_as_Registered();
    if (r->status() == wire::Status::Ok)
      ++ok;
    else if (first_error.empty())
      first_error = r->error() ? r->error()->str() : "?";
  }
  writer.join();
  INFO(first_error);
  REQUIRE(ok == n);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct ListPage {
  wire::Status status{};
  std::string error, json;
  std::size_t frame_bytes = 0;
};

// One ListScripts request; `after` null: no cursor field at all (as an older client sends).
ListPage list_page(RawClient& rc, const std::string* after, uint32_t limit) {
  flatbuffers::FlatBufferBuilder f;
  const uint64_t id = rc.next_id++;
  // An empty cursor is not written: the same frame as no cursor at all.
  const auto frame = outrun::protocol::encode_control(f, id, wire::ControlCommand::ListScripts, 0,
                                                      after ? *after : std::string(), limit);
  rc.send({frame.begin(), frame.end()});
  const auto fv = rc.next();
  REQUIRE(fv.frame->body_type() == wire::Body::ControlReply);
  const auto* r = fv.frame->body_as_ControlReply();
  REQUIRE(r->request_id() == id);
  return {r->status(), r->error() ? r->error()->str() : "", r->json() ? r->json()->str() : "",
          fv.bytes.size()};
}

constexpr std::size_t kPageBytes = std::size_t{4} << 20;  // kMaxPageBytes (protocol.md)

// Every page through `rc`: each Ok, its frame under kMaxFrameSize and its document within
// kPageBytes; `on_script` gets each listed script. Returns the pages.
template <typename Fn>
int list_all(RawClient& rc, uint32_t limit, Fn on_script, std::size_t* max_frame = nullptr,
             double* max_page_ms = nullptr) {
  std::string after;
  int pages = 0;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    const ListPage p = list_page(rc, pages ? &after : nullptr, limit);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (max_page_ms) *max_page_ms = std::max(*max_page_ms, ms);
    if (max_frame) *max_frame = std::max(*max_frame, p.frame_bytes);
    INFO(p.error);
    REQUIRE(p.status == wire::Status::Ok);
    CHECK(p.frame_bytes < outrun::protocol::kMaxFrameSize);
    CHECK(p.json.size() <= kPageBytes);
    ++pages;
    const auto j = nlohmann::json::parse(p.json);
    for (const auto& s : j["scripts"]) on_script(s);
    if (j["next"].is_null()) break;
    REQUIRE(j["next"].is_string());
    REQUIRE(j["next"] != after);
    after = j["next"];
  }
  return pages;
}

std::string index_key(int i) {
  char b[24];
  std::snprintf(b, sizeof b, "k%06d", i);
  return b;
}

}  // namespace

TEST_CASE(
    "outrund: outrun scripts --json lists 300,000 scripts, every reply frame within the limit") {
  Daemon d;
  // 300,000 in normal builds; a tenth under sanitizers, where registering and listing 300,000
  // runs past the test timeout (the paging itself is the same code; the byte cut has its own
  // test below).
  const int kN = outrun::test::kSanitized ? 30000 : 300000;
  const double reg_s = register_many(d, kN, index_key, "return 1");
  MESSAGE("registered " << kN << " scripts (pipelined) in " << reg_s << " s");
  CHECK(d.stats()["scripts"] == kN);

  // The pages themselves: 10,000 scripts each, frames far under the limit, every key once.
  RawClient rc(d.socket);
  std::vector<int> seen(kN);
  std::size_t max_frame = 0;
  double max_page_ms = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const int pages = list_all(
      rc, 10000,
      [&](const nlohmann::json& s) {
        const std::string k = s["key"];
        REQUIRE(k.size() == 7);
        ++seen[std::stoi(k.substr(1))];
      },
      &max_frame, &max_page_ms);
  const double list_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(pages << " pages in " << list_s << " s; largest reply frame " << max_frame
                << " bytes; slowest page " << max_page_ms << " ms (request to reply)");
  CHECK(pages == kN / 10000);
  CHECK(std::count(seen.begin(), seen.end(), 1) == kN);

  // The real CLI, both renderings.
  const std::string cli = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket;
  const std::string json_out = d.dir + "/scripts.json", text_out = d.dir + "/scripts.txt";
  auto c0 = std::chrono::steady_clock::now();
  CHECK(run_command(cli + " scripts --json > " + json_out).first == 0);
  const double cli_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  CHECK(run_command(cli + " scripts > " + text_out).first == 0);
  {
    std::ifstream in(json_out);
    CHECK(nlohmann::json::accept(in));  // one valid document (checked without building it)
  }
  std::fill(seen.begin(), seen.end(), 0);
  std::ifstream in(json_out);
  std::string line;
  std::size_t bytes = 0;
  while (std::getline(in, line)) {
    bytes += line.size() + 1;
    const auto p = line.find("\"key\": \"k");
    if (p != std::string::npos) ++seen[std::stoi(line.substr(p + 9, 6))];
  }
  MESSAGE("outrun scripts --json: " << cli_s << " s, " << bytes << " bytes");
  CHECK(std::count(seen.begin(), seen.end(), 1) == kN);
  std::ifstream text(text_out);
  int lines = 0;
  while (std::getline(text, line)) ++lines;
  CHECK(lines == kN + 1);  // the header and one line per script
  std::remove(json_out.c_str());
  std::remove(text_out.c_str());
  check_client_works(d, "after.300k");
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund: ListScripts pages are cut by bytes: 10,000 keys of 256 control characters") {
  // Each script's entry is ~1.7 KB of JSON (a control character escapes to 6 bytes): 10,000 in
  // one page would be ~17 MB, more than a frame holds.
  Daemon d;
  constexpr int kN = 10000;
  auto key = [](int i) {
    char b[16];
    std::snprintf(b, sizeof b, "%06d", i);
    return std::string(250, '\x01') + b;
  };
  register_many(d, kN, key, "return 1");
  RawClient rc(d.socket);
  std::vector<int> seen(kN);
  std::size_t max_frame = 0;
  const int pages = list_all(
      rc, 10000,
      [&](const nlohmann::json& s) {
        const std::string k = s["key"];
        REQUIRE(k.size() == 256);
        REQUIRE(k.substr(0, 250) == std::string(250, '\x01'));
        ++seen[std::stoi(k.substr(250))];
      },
      &max_frame);
  MESSAGE(pages << " pages, largest reply frame " << max_frame << " bytes");
  CHECK(pages >= 4);
  CHECK(std::count(seen.begin(), seen.end(), 1) == kN);
  // The CLI escapes them, as before paging: no raw control byte reaches the terminal.
  const std::string cli = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket;
  auto [rc1, text] = run_command(cli + " scripts");
  CHECK(rc1 == 0);
  CHECK(text.find('\x01') == std::string::npos);
  CHECK(text.find("\\x01\\x01") != std::string::npos);
  auto [rc2, js] = run_command(cli + " scripts --json");
  CHECK(rc2 == 0);
  CHECK(js.find('\x01') == std::string::npos);
  const auto doc = nlohmann::json::parse(js);
  CHECK(doc["scripts"].size() == kN);
  CHECK(d.stop() == 0);
}

TEST_CASE(
    "outrund: malformed ListScripts paging fields: clear errors or empty pages, never a crash") {
  Daemon d;
  constexpr int kN = 1500;
  register_many(d, kN, index_key, "return 1");
  RawClient rc(d.socket);
  auto keys_of = [](const ListPage& p) {
    std::vector<std::string> k;
    const auto doc = nlohmann::json::parse(p.json);
    for (const auto& s : doc["scripts"]) k.push_back(s["key"]);
    return k;
  };
  // No paging fields (an older client): the first page, 1,000 scripts, and a cursor.
  ListPage p = list_page(rc, nullptr, 0);
  REQUIRE(p.status == wire::Status::Ok);
  auto j = nlohmann::json::parse(p.json);
  CHECK(j["scripts"].size() == 1000);
  CHECK(j["total"] == kN);
  CHECK(j["scripts"][0]["key"] == "k000000");
  REQUIRE(j["next"].is_string());
  const std::string next = j["next"];
  p = list_page(rc, &next, 0);
  CHECK(keys_of(p).size() == 500);
  CHECK(keys_of(p).front() == "k001000");
  CHECK(nlohmann::json::parse(p.json)["next"].is_null());
  // A huge limit is read as 10,000; limit 1 gives one script and a cursor.
  p = list_page(rc, nullptr, UINT32_MAX);
  CHECK(keys_of(p).size() == kN);
  p = list_page(rc, nullptr, 1);
  CHECK(keys_of(p) == std::vector<std::string>{"k000000"});
  // Past the end ("\xff" sorts after every key), and a skip past a key's handles: empty pages or
  // the next key, not errors.
  const std::string past = "ff:0", skip_all = "6b303030303030:4294967295", before = "6b:0";
  p = list_page(rc, &past, 0);
  REQUIRE(p.status == wire::Status::Ok);
  CHECK(keys_of(p).empty());
  CHECK(nlohmann::json::parse(p.json)["next"].is_null());
  p = list_page(rc, &skip_all, 1);  // k000000, all of its handles listed: k000001 is next
  CHECK(keys_of(p) == std::vector<std::string>{"k000001"});
  p = list_page(rc, &before, 1);  // "k" is not a key; the page starts at the first one after it
  CHECK(keys_of(p) == std::vector<std::string>{"k000000"});
  // Garbage cursors: invalid_argument that says what to send, and the connection goes on.
  for (const std::string& bad :
       std::vector<std::string>{"zz", "abc", ":1", "6b:", "6b:x", "6b:99999999999", "6:1", "6B:0",
                                "6b:1:2", std::string(600, 'a') + ":0", std::string("6b\0:0", 5)}) {
    p = list_page(rc, &bad, 0);
    CHECK(p.status == wire::Status::InvalidArgument);
    CHECK(p.error.find("not a cursor") != std::string::npos);
    CHECK(p.json.empty());
  }
  // outrun::Client pages through everything.
  std::string all;
  REQUIRE(!d.client()->scripts_json(&all));
  CHECK(nlohmann::json::parse(all)["scripts"].size() == kN);
  check_client_works(d, "after.malformed");
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund: register with check answers compile_error and registers nothing") {
  Daemon d;
  auto c = d.client();
  outrun::RegisterOptions check;
  check.check = true;
  outrun::Script good, s;
  REQUIRE(!c->register_script("rc.k", "local a = inputs.a\nreturn a", &good, check));
  const outrun::Error e = c->register_script("rc.k", "local a = 1\n\nreturn a +", &s, check);
  CHECK(e.code == outrun::ErrorCode::compile_error);
  const std::string msg = e.message;
  CHECK_MESSAGE(msg.rfind("rc.k:3:", 0) == 0, msg);
  CHECK(!s.valid());
  CHECK(c->register_script("rc.never", "return = 1", &s, check).code ==
        outrun::ErrorCode::compile_error);
  std::string scripts;
  REQUIRE(!c->scripts_json(&scripts));
  const auto j = nlohmann::json::parse(scripts);
  std::vector<std::string> keys;
  for (const auto& x : j["scripts"]) keys.push_back(x["key"].get<std::string>());
  CHECK(std::find(keys.begin(), keys.end(), "rc.never") == keys.end());
  CHECK(std::find(keys.begin(), keys.end(), "rc.k") != keys.end());
  // The key keeps its checked source.
  const outrun::Result r = c->evaluate(good, {{"a", 4}}).get();
  CHECK(r.status == outrun::Status::ok);
  CHECK(r.value == outrun::Value(int64_t{4}));

  // Pipelined behind a checked Register, a Control and an unchecked Register are answered after
  // it, in order.
  RawClient rc(d.socket);
  flatbuffers::FlatBufferBuilder f;
  std::vector<uint8_t> buf;
  auto add = [&](std::span<const uint8_t> frame) {
    buf.insert(buf.end(), frame.begin(), frame.end());
    f.Clear();
  };
  add(outrun::protocol::encode_register(f, 1, "rc.raw", "return +", true));
  add(outrun::protocol::encode_control(f, 2, wire::ControlCommand::Stats, 0));
  add(outrun::protocol::encode_register(f, 3, "rc.raw2", "return 3", true));
  add(outrun::protocol::encode_register(f, 4, "rc.raw3", "return +", false));
  rc.send(buf);
  {
    const auto fv = rc.next();
    REQUIRE(fv.frame->body_type() == wire::Body::Registered);
    CHECK(fv.frame->body_as_Registered()->request_id() == 1);
    CHECK(fv.frame->body_as_Registered()->status() == wire::Status::CompileError);
  }
  CHECK(rc.next().frame->body_type() == wire::Body::ControlReply);
  for (uint64_t id : {3, 4}) {
    const auto fv = rc.next();
    REQUIRE(fv.frame->body_type() == wire::Body::Registered);
    CHECK(fv.frame->body_as_Registered()->request_id() == id);
    CHECK(fv.frame->body_as_Registered()->status() == wire::Status::Ok);
  }

  // The CLI: exit 1 and the message for a syntax error, 0 once it compiles.
  const std::string cli = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket;
  auto res = run_command(
      cli + " register rc.cli --check -e \"$(printf 'local x = 1\\nreturn x +')\" 2>&1");
  CHECK(res.first == 1);
  CHECK_MESSAGE(res.second.find("compile_error: rc.cli:2:") != std::string::npos, res.second);
  res = run_command(cli + " register rc.cli -e 'return 1' --check 2>&1");
  CHECK(res.first == 0);
  CHECK_MESSAGE(res.second.find("registered rc.cli") != std::string::npos, res.second);
  res = run_command(cli + " register rc.cli2 -e 'return +' 2>&1");  // no check: registered
  CHECK(res.first == 0);
  CHECK(d.stop() == 0);
}
