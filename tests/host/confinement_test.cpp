// Process confinement of the workers (worker/confine.cpp), through the public Host API and the
// worker's /proc entries: rlimits, no_new_privs, the seccomp filter, the fds it keeps, what a
// worker that tries to escape gets (killed with SIGSYS, reported, restarted), the address-space
// backstop and the memory figures on the status page.
#include <dirent.h>
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "host/host_support.h"
#include "outrun/host.h"
#include "test_support.h"

using namespace std::chrono_literals;
using outrun::Host;
using outrun::HostOptions;
using outrun::Inputs;
using outrun::Result;
using outrun::Script;
using outrun::Status;
using outrun::Value;
using outrun::test::FaultEnv;
using outrun::test::reg;
using outrun::test::start_host;
using outrun::test::with_test_faults;

namespace {

using outrun::test::kSanitized;

HostOptions one_shard() {
  HostOptions o;
  o.shards = 1;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.timeout = 5000ms;
  o.grace = 5000ms;
  o.restart_delay = 1ms;
  return o;
}

std::string describe(const Result& r) {
  return std::string(outrun::to_string(r.status)) + ": " + r.error;
}

// "Name:\tvalue" lines of /proc/PID/status.
std::string proc_status_field(int pid, const std::string& name) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(name + ":", 0) == 0) {
      std::string v = line.substr(name.size() + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "?";
}

// The soft limit of one row of /proc/PID/limits ("Max open files   4   4   files").
std::string proc_limit(int pid, const std::string& row) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/limits");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(row, 0) == 0) {
      std::istringstream in(line.substr(row.size()));
      std::string soft;
      in >> soft;
      return soft;
    }
  return "?";
}

std::set<int> open_fds(int pid) {
  std::set<int> fds;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') fds.insert(std::atoi(e->d_name));
    closedir(d);
  }
  return fds;
}

std::string fd_target(int pid, int fd) {
  char buf[256];
  const std::string link = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "?";
}

}  // namespace

TEST_CASE(
    "Confinement: a serving worker has no_new_privs, a seccomp filter, tight rlimits and four "
    "fds") {
  HostOptions o = one_shard();
  o.worker_address_space_limit = std::size_t{1} << 30;
  auto host = start_host(o);
  Script s = reg(*host, "k", "return inputs.a + 1");
  const Result r = host->evaluate(s, Inputs{{"a", Value(int64_t{1})}}).get();
  REQUIRE_MESSAGE(r.status == Status::ok, describe(r));
  const int pid = host->worker_pids().at(0);
  CHECK(proc_status_field(pid, "NoNewPrivs") == "1");
  CHECK(proc_status_field(pid, "Seccomp") == "2");  // filter mode
  CHECK(proc_limit(pid, "Max open files") == "5");
  CHECK(proc_limit(pid, "Max processes") == "0");
  CHECK(proc_limit(pid, "Max file size") == "0");
  CHECK(proc_limit(pid, "Max core file size") == "0");
  if (!kSanitized)
    CHECK(proc_limit(pid, "Max address space") == std::to_string(std::size_t{1} << 30));
  // stdin/stdout are /dev/null, stderr is a pipe (socket) to the host, 3 and 4 the sockets
  // frames come in and results go out.
  CHECK(open_fds(pid) == std::set<int>{0, 1, 2, 3, 4});
  CHECK(fd_target(pid, 0) == "/dev/null");
  CHECK(fd_target(pid, 1) == "/dev/null");
  CHECK(fd_target(pid, 2).rfind("socket:", 0) == 0);
  CHECK(fd_target(pid, 3).rfind("socket:", 0) == 0);
  CHECK(fd_target(pid, 4).rfind("socket:", 0) == 0);
}

TEST_CASE(
    "Confinement: each escape attempt is killed by the filter, reported, and the shard serves "
    "again") {
  FaultEnv fault("escape");
  for (const char* attempt : {"open", "socket", "fork", "exec", "mmap-exec", "kill-host"}) {
    CAPTURE(attempt);
    auto host = start_host(with_test_faults(one_shard()));
    Script s = reg(*host, "k", "return inputs.a + 1");
    const int before = host->worker_pids().at(0);
    const Result r =
        host->evaluate(s, Inputs{{"a", Value(int64_t{1})}, {"escape", Value(std::string(attempt))}})
            .get();
    // The evaluation that was running is the crash's suspect: it is not retried.
    CHECK_MESSAGE(r.status == Status::worker_lost, describe(r));
    CHECK_MESSAGE(r.error.find("signal 31 (Bad system call)") != std::string::npos, describe(r));
    CHECK_MESSAGE(r.error.find("seccomp filter") != std::string::npos, describe(r));
    const Result next = host->evaluate(s, Inputs{{"a", Value(int64_t{41})}}).get();
    CHECK_MESSAGE(next.status == Status::ok, describe(next));
    CHECK(next.value == Value(int64_t{42}));
    const auto st = host->shard_stats(0);
    CHECK(st.crashed == 1);
    CHECK(st.last_death.find("Bad system call") != std::string::npos);
    CHECK(host->worker_pids().at(0) != before);
  }
}

TEST_CASE(
    "Confinement: the shipped outrun-worker has no test faults, OUTRUN_TEST_FAULT is ignored") {
  // Faults that would make outrun-test-worker exit at start ("/" exists) and refuse every
  // source, and a name it does not know (exit 64 at start): outrun-worker reads none of them.
  FaultEnv fault("crash-at-start=/,need-source-loop,escape,no-such-fault");
  auto host = start_host(one_shard());
  Script s = reg(*host, "k", "return inputs.a + 1");
  for (int64_t i = 0; i < 20; ++i) {
    const Result r =
        host->evaluate(s, Inputs{{"a", Value(i)}, {"escape", Value(std::string("open"))}}).get();
    CHECK_MESSAGE(r.status == Status::ok, describe(r));
    CHECK(r.value == Value(i + 1));
  }
  const auto st = host->shard_stats(0);
  CHECK(st.deaths == 0);
  CHECK(st.starts == 1);
  host.reset();
  // The same environment stops outrun-test-worker at start: the faults were real.
  std::unique_ptr<outrun::Host> faulty;
  CHECK(outrun::Host::create(with_test_faults(one_shard()), &faulty).code ==
        outrun::ErrorCode::unavailable);
  CHECK(!faulty);
  // Not even the variable's name is in the shipped binary; the test worker's has it.
  auto contains = [](const char* file, const std::string& what) {
    std::ifstream f(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    REQUIRE(!bytes.empty());
    return bytes.find(what) != std::string::npos;
  };
  CHECK(!contains(OUTRUN_TEST_WORKER, "OUTRUN_TEST_FAULT"));
  CHECK(!contains(OUTRUN_TEST_WORKER, "test fault"));
  CHECK(contains(OUTRUN_TEST_FAULT_WORKER, "OUTRUN_TEST_FAULT"));
}

TEST_CASE("Confinement: the address-space backstop fails a script's allocation, not the worker") {
  if (kSanitized) {
    MESSAGE("RLIMIT_AS is not applied in sanitizer builds");
    return;
  }
  HostOptions o = one_shard();
  o.memory_limit = std::size_t{2} << 30;          // the per-script cap would allow it...
  o.worker_script_budget = std::size_t{4} << 30;  // ...so would the worker's script budget...
  o.worker_address_space_limit = 256u << 20;      // ...the process-wide backstop does not
  auto host = start_host(o);
  Script bomb = reg(*host, "bomb", R"(
    local t = {}
    for i = 1, 64 do t[i] = string.rep("x", 8 << 20, tostring(i)) end
    return #t)");
  Script fine = reg(*host, "fine", "return inputs.a + 1");
  const int pid = host->worker_pids().at(0);
  const Result r = host->evaluate(bomb, {}).get();
  CHECK_MESSAGE(r.status == Status::memory_limit, describe(r));
  CHECK_MESSAGE(r.error.find("out of memory") != std::string::npos, describe(r));
  CHECK_MESSAGE(r.error.find("backstop") != std::string::npos, describe(r));
  const Result next = host->evaluate(fine, Inputs{{"a", Value(int64_t{1})}}).get();
  CHECK_MESSAGE(next.status == Status::ok, describe(next));
  CHECK(host->worker_pids().at(0) == pid);  // the same worker goes on serving
}

TEST_CASE(
    "Confinement: a worker whose own memory blows up past the backstop dies and is restarted") {
  if (kSanitized) {
    MESSAGE("RLIMIT_AS is not applied in sanitizer builds");
    return;
  }
  FaultEnv fault("escape");
  HostOptions o = with_test_faults(one_shard());
  o.worker_address_space_limit = 256u << 20;
  auto host = start_host(o);
  Script s = reg(*host, "k", "return inputs.a + 1");
  const Result r =
      host->evaluate(s, Inputs{{"a", Value(int64_t{1})}, {"escape", Value(std::string("blow-up"))}})
          .get();
  CHECK_MESSAGE(r.status == Status::worker_lost, describe(r));
  CHECK_MESSAGE(r.error.find("signal 6") != std::string::npos, describe(r));  // bad_alloc -> abort
  const Result next = host->evaluate(s, Inputs{{"a", Value(int64_t{1})}}).get();
  CHECK_MESSAGE(next.status == Status::ok, describe(next));
  CHECK(host->shard_stats(0).crashed == 1);
}

TEST_CASE("Confinement: the worker's memory figures are reported") {
  HostOptions o = one_shard();
  o.heartbeat_interval = 10ms;
  auto host = start_host(o);
  Script s = reg(*host, "k", "return inputs.a + 1");
  REQUIRE(host->evaluate(s, Inputs{{"a", Value(int64_t{1})}}).get().status == Status::ok);
  outrun::ShardStats st;
  for (int i = 0; i < 500; ++i) {  // the peak is published with the heartbeat
    st = host->shard_stats(0);
    if (st.worker_peak_rss_bytes > 0) break;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(st.worker_peak_rss_bytes > 0);
  CHECK(st.worker_rss_bytes > 0);
  CHECK(st.uptime_ms >= 0);  // the current worker's age, from the host's own spawn time
  CHECK(st.worker_rss_bytes <= st.worker_peak_rss_bytes + (1u << 20));
}
