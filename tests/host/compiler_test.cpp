// The compile-only process (design/sandbox.md "The compiler") through the public API, with real
// processes: registered scripts' bytecode is made ahead, a restarted worker loads it instead of
// compiling, and a compile-only process that dies, stops or lies costs no script anything but
// its bytecode.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "host/host_support.h"
#include "outrun/host.h"

using namespace outrun;
using namespace std::chrono_literals;
using test::eventually;
using test::FaultEnv;
using test::reg;

namespace {

HostOptions options(int shards = 1) {
  HostOptions o;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = shards;
  o.restart_delay = 5ms;
  o.timeout = 2000ms;  // about processes, not kills: no T+G kill on a loaded machine
  o.grace = 5000ms;
  return o;
}

Result get(Future f) {
  REQUIRE(f.wait_for(30s) == std::future_status::ready);
  return f.get();
}

std::string source_of(int i) {
  return "local a = inputs.a\nlocal b = a * 2\nreturn b + " + std::to_string(i);
}

bool compiled_all(const Host& h, uint64_t n) {
  const CompilerStats c = h.compiler_stats();
  return c.idle && c.compiled >= n;
}

bool restarted(const Host& h, uint64_t starts) {
  return h.shard_stats(0).starts > starts && h.shard_stats(0).state == "running";
}

}  // namespace

TEST_CASE("compiler: a killed shard's scripts come back from the host's bytecode, none compiled") {
  auto host = test::start_host(options());
  std::vector<Script> scripts;
  for (int i = 0; i < 50; ++i)
    scripts.push_back(reg(*host, "tag." + std::to_string(i), source_of(i)));
  Script thrower = reg(*host, "thrower", "local x = inputs.a\n\nerror('no ' .. x)");
  REQUIRE(eventually([&] { return compiled_all(*host, 51); }));
  const CompilerStats c = host->compiler_stats();
  CHECK(c.pid > 0);
  CHECK(c.cached_bytes > 0);
  for (int i = 0; i < 50; ++i)
    CHECK(get(host->evaluate(scripts[static_cast<std::size_t>(i)], {{"a", 1}})).value ==
          Value(int64_t{2 + i}));
  const uint64_t starts = host->shard_stats(0).starts;
  REQUIRE(!host->kill_shard(0));
  REQUIRE(eventually([&] { return restarted(*host, starts); }));
  for (int i = 0; i < 50; ++i) {
    const Result r = get(host->evaluate(scripts[static_cast<std::size_t>(i)], {{"a", 3}}));
    REQUIRE_MESSAGE(r.status == Status::ok, r.error);
    CHECK(r.value == Value(int64_t{6 + i}));
  }
  // The bytecode keeps the debug information: a runtime error names the chunk and line.
  const Result e = get(host->evaluate(thrower, {{"a", 7}}));
  CHECK(e.status == Status::runtime_error);
  CHECK_MESSAGE(e.error.find("thrower:3: no 7") != std::string::npos, e.error);
  const ShardStats st = host->shard_stats(0);
  CHECK(st.worker_compiles == 0);  // the new worker compiled nothing
  CHECK(st.worker_bytecode_loads == 51);
}

TEST_CASE("compiler: a source that does not compile keeps its source path and its error") {
  auto host = test::start_host(options());
  Script bad = reg(*host, "bad", "return +");
  Script good = reg(*host, "good", "return 1");
  REQUIRE(eventually([&] { return compiled_all(*host, 1); }));
  CHECK(host->compiler_stats().refused >= 1);
  const uint64_t starts = host->shard_stats(0).starts;
  REQUIRE(!host->kill_shard(0));
  REQUIRE(eventually([&] { return restarted(*host, starts); }));
  const Result r = get(host->evaluate(bad, {}));
  CHECK(r.status == Status::compile_error);
  CHECK_MESSAGE(r.error.find("bad:1:") != std::string::npos, r.error);
  CHECK(get(host->evaluate(good, {})).value == Value(int64_t{1}));
  CHECK(host->shard_stats(0).worker_compiles == 1);  // bad's source, compiled by the worker
}

TEST_CASE("compiler: a killed compile-only process is started again and goes on compiling") {
  auto host = test::start_host(options());
  Script a = reg(*host, "a", "return 1");
  REQUIRE(eventually([&] { return compiled_all(*host, 1); }));
  const int pid = host->compiler_stats().pid;
  REQUIRE(pid > 0);
  REQUIRE(kill(pid, SIGKILL) == 0);
  REQUIRE(eventually([&] {
    const CompilerStats c = host->compiler_stats();
    return c.restarts >= 1 && c.pid > 0 && c.pid != pid;
  }));
  Script b = reg(*host, "b", "return 2");
  REQUIRE(eventually([&] { return compiled_all(*host, 2); }));
  CHECK(eventually([&] { return test::process_gone(pid); }, 5s));  // SIGKILL is asynchronous
  CHECK(get(host->evaluate(a, {})).value == Value(int64_t{1}));
  CHECK(get(host->evaluate(b, {})).value == Value(int64_t{2}));
  CHECK(host->shard_stats(0).deaths == 0);  // the shard never noticed
}

TEST_CASE("compiler: one that stops answering is killed at its deadline, its batch retried") {
  auto host = test::start_host(options());
  Script a = reg(*host, "a", "return 1");
  REQUIRE(eventually([&] { return compiled_all(*host, 1); }));
  const int pid = host->compiler_stats().pid;
  REQUIRE(kill(pid, SIGSTOP) == 0);
  std::vector<Script> more;
  for (int i = 0; i < 3; ++i) more.push_back(reg(*host, "m." + std::to_string(i), source_of(i)));
  // Meanwhile the workers compile what they are sent: nothing waits for the compile-only process.
  for (int i = 0; i < 3; ++i)
    CHECK(get(host->evaluate(more[static_cast<std::size_t>(i)], {{"a", 1}})).value ==
          Value(int64_t{2 + i}));
  REQUIRE(eventually([&] { return host->compiler_stats().kills >= 1; }, 15s));
  // What was in the stalled frame goes again one source per frame; a frame of one source that
  // fails is given up (that script keeps its source path). Which of m.* were in it depends on
  // timing: one alone (given up, the other two compiled by the new process) or more (all
  // compiled).
  REQUIRE(eventually(
      [&] {
        const CompilerStats c = host->compiler_stats();
        return c.idle && c.compiled + c.refused >= 4;
      },
      15s));
  CHECK(host->compiler_stats().compiled >= 3);
  CHECK(eventually([&] { return test::process_gone(pid); }, 5s));  // SIGKILL is asynchronous
  CHECK(host->compiler_stats().pid != pid);
}

TEST_CASE("compiler: bytes that are no Lua chunk are refused, and the script keeps its source") {
  FaultEnv fault("compiler-garbage");
  auto host = test::start_host(test::with_test_faults(options()));
  Script a = reg(*host, "a", "return 41 + inputs.a");
  REQUIRE(eventually([&] {
    const CompilerStats c = host->compiler_stats();
    return c.kills >= 1 && c.refused >= 1 && c.idle;
  }));

  CHECK(host->compiler_stats().compiled == 0);
  CHECK(host->compiler_stats().cached_bytes == 0);
  const uint64_t starts = host->shard_stats(0).starts;
  REQUIRE(!host->kill_shard(0));
  REQUIRE(eventually([&] { return restarted(*host, starts); }));
  CHECK(get(host->evaluate(a, {{"a", 1}})).value == Value(int64_t{42}));
  CHECK(host->shard_stats(0).worker_compiles == 1);
  CHECK(host->shard_stats(0).worker_bytecode_loads == 0);
}

TEST_CASE("compiler: the cache keeps what fits, and 0 starts no compile-only process") {
  SUBCASE("a cache of 1 KB") {
    HostOptions o = options();
    o.bytecode_cache_bytes = 1000;
    auto host = test::start_host(o);
    std::vector<Script> s;
    for (int i = 0; i < 20; ++i) s.push_back(reg(*host, "s." + std::to_string(i), source_of(i)));
    REQUIRE(eventually([&] { return host->compiler_stats().idle; }));
    const CompilerStats c = host->compiler_stats();
    CHECK(c.compiled >= 1);
    CHECK(c.compiled < 20);
    CHECK(c.refused >= 20 - c.compiled);
    CHECK(c.cached_bytes <= 1000);
    for (int i = 0; i < 20; ++i)
      CHECK(get(host->evaluate(s[static_cast<std::size_t>(i)], {{"a", 1}})).value ==
            Value(int64_t{2 + i}));
  }
  SUBCASE("none") {
    HostOptions o = options();
    o.bytecode_cache_bytes = 0;
    auto host = test::start_host(o);
    Script a = reg(*host, "a", "return 1");
    CHECK(get(host->evaluate(a, {})).value == Value(int64_t{1}));
    CHECK(host->compiler_stats().pid == 0);
    CHECK(host->compiler_stats().compiled == 0);
  }
}

TEST_CASE("compiler: an unregistered script's record is not kept alive by the queue") {
  auto host = test::start_host(options());
  const RegistryStats before = host->registry_stats();
  for (int i = 0; i < 2000; ++i) {
    const std::string key = "gone." + std::to_string(i);
    Script s = reg(*host, key, source_of(i));
    REQUIRE(!host->unregister_script(key));
    // The handle goes here: nothing else holds the record, the queue names it only.
  }
  CHECK(host->registry_stats().scripts == before.scripts);
  REQUIRE(eventually([&] { return host->compiler_stats().idle; }));
  CHECK(host->compiler_stats().compiled < 2000);
}

TEST_CASE("compiler: one that never says hello is killed at its deadline, the workers go on") {
  char tmpl[] = "/tmp/outrun-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string wrapper = dir + "/worker";
  // The compile-only process hangs before its hello (a stuck or wrong binary); workers are real.
  std::ofstream(wrapper) << "#!/bin/sh\ncase \"$*\" in *--compile-only*) exec sleep 1000;; esac\n"
                         << "exec '" OUTRUN_TEST_WORKER "' \"$@\"\n";
  chmod(wrapper.c_str(), 0755);
  HostOptions o = options();
  o.worker_path = wrapper;
  auto host = test::start_host(o);
  Script a = reg(*host, "a", "return 1 + inputs.a");
  CHECK(get(host->evaluate(a, {{"a", 1}})).value == Value(int64_t{2}));
  // The process now (a slow machine may already be on its second: each is killed in turn).
  int pid = 0;
  REQUIRE(eventually([&] { return (pid = host->compiler_stats().pid) > 0; }));
  const uint64_t kills = host->compiler_stats().kills;
  REQUIRE(eventually([&] { return host->compiler_stats().kills > kills; }, 15s));
  CHECK(eventually([&] { return test::process_gone(pid); }, 5s));  // SIGKILL is asynchronous
  CHECK(host->compiler_stats().compiled == 0);
  CHECK(get(host->evaluate(a, {{"a", 2}})).value == Value(int64_t{3}));
  host.reset();
  std::filesystem::remove_all(dir);
}

TEST_CASE("compiler: bytecode larger than 1 MiB is not kept, the script keeps its source path") {
  auto host = test::start_host(options());
  std::string src = "local a = inputs.a\nreturn a";
  for (int i = 0; i < 300000; ++i) src += "+a";  // 600 KB of source, ~3 MB of bytecode
  Script big = reg(*host, "big", src);
  REQUIRE(eventually([&] { return host->compiler_stats().idle; }, 30s));
  CHECK(host->compiler_stats().compiled == 0);
  CHECK(host->compiler_stats().refused == 1);
  const uint64_t starts = host->shard_stats(0).starts;
  REQUIRE(!host->kill_shard(0));
  REQUIRE(eventually([&] { return restarted(*host, starts); }));
  const Result r = get(host->evaluate(big, {{"a", 1}}));
  REQUIRE_MESSAGE(r.status == Status::ok, r.error);
  CHECK(r.value == Value(int64_t{300001}));
  CHECK(host->shard_stats(0).worker_compiles == 1);
}

TEST_CASE("compiler: a script whose bytecode its worker dropped comes back as bytecode, not text") {
  // 1,000 scripts with a 24 KiB constant in a 16 MiB budget: the worker keeps a quarter of it as
  // bytecode, so most are dropped and answered NeedSource (budget_test.cpp has the same load).
  HostOptions o = options();
  o.worker_script_budget = 16u << 20;
  auto host = test::start_host(o);
  std::vector<Script> scripts;
  const std::string blob(24 * 1024, 'z');
  for (int i = 0; i < 1000; ++i)
    scripts.push_back(reg(*host, "blob." + std::to_string(i),
                          "local s = '" + blob + "'\nreturn #s + inputs.a + " + std::to_string(i)));
  REQUIRE(eventually([&] { return compiled_all(*host, 1000); }, 30s));
  for (int round = 0; round < 2; ++round)
    for (int k = 0; k < 1000; ++k) {
      const int i = round == 0 ? k : 999 - k;
      const Result r = get(host->evaluate(scripts[static_cast<std::size_t>(i)], {{"a", 1}}));
      REQUIRE_MESSAGE(r.status == Status::ok, r.error);
      REQUIRE(r.value == Value(int64_t{24 * 1024 + 1 + i}));
    }
  const ShardStats st = host->shard_stats(0);
  CHECK(st.worker_compiles == 0);
  CHECK(st.worker_bytecode_loads > 1000);  // the first round's, and the dropped ones' again
  CHECK(st.deaths == 0);
}

TEST_CASE("compiler: register_script with check refuses a syntax error and registers nothing") {
  auto host = test::start_host(options());
  RegisterOptions check;
  check.check = true;
  Script good;
  REQUIRE(!host->register_script("checked", "local a = inputs.a\nreturn a", &good, check));
  CHECK(good.valid());
  const RegistryStats before = host->registry_stats();
  // The key keeps its record: a failed check changes nothing.
  Script s;
  const Error e = host->register_script("checked", "local a = 1\n\nreturn a +", &s, check);
  CHECK(e.code == ErrorCode::compile_error);
  CHECK_MESSAGE(e.message.rfind("checked:3:", 0) == 0, e.message);
  CHECK(!s.valid());
  const Error e2 = host->register_script("never", "return = 1", &s, check);
  CHECK(e2.code == ErrorCode::compile_error);
  CHECK_MESSAGE(e2.message.rfind("never:1:", 0) == 0, e2.message);
  const RegistryStats after = host->registry_stats();
  CHECK(after.scripts == before.scripts);
  CHECK(after.bytes == before.bytes);
  CHECK(get(host->evaluate(good, {{"a", 5}})).value == Value(int64_t{5}));
  CHECK(host->unregister_script("never").code == ErrorCode::invalid_argument);  // unknown key
  // Without check: registered as before; the worker reports the error.
  Script unchecked;
  REQUIRE(!host->register_script("unchecked", "return = 1", &unchecked));
  CHECK(get(host->evaluate(unchecked, {})).status == Status::compile_error);
}

TEST_CASE("compiler: register_script with check and no compile-only process is unavailable") {
  HostOptions o = options();
  o.bytecode_cache_bytes = 0;
  auto host = test::start_host(o);
  RegisterOptions check;
  check.check = true;
  Script s;
  const Error e = host->register_script("k", "return 1", &s, check);
  CHECK(e.code == ErrorCode::unavailable);
  CHECK_MESSAGE(e.message.find("bytecode_cache_bytes") != std::string::npos, e.message);
  CHECK(host->registry_stats().scripts == 0);
  REQUIRE(!host->register_script("k", "return 1", &s));  // without check, as always
}

TEST_CASE("compiler: register_script with check survives a compile-only process killed meanwhile") {
  auto host = test::start_host(options());
  REQUIRE(eventually([&] { return host->compiler_stats().pid > 0; }));
  REQUIRE(kill(host->compiler_stats().pid, SIGKILL) == 0);
  RegisterOptions check;
  check.check = true;
  Script s;
  const Error e = host->register_script("after.kill", "return +", &s, check);
  CHECK(e.code == ErrorCode::compile_error);
  CHECK_MESSAGE(e.message.rfind("after.kill:1:", 0) == 0, e.message);
  REQUIRE(!host->register_script("after.kill", "return 2", &s, check));
  CHECK(get(host->evaluate(s, {})).value == Value(int64_t{2}));
}
