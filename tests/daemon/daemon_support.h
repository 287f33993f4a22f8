// The real outrund on a temporary socket, for the daemon's integration tests.
#pragma once

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "daemon_process.h"
#include "outrun/client.h"
#include "test_support.h"

namespace outrun::test {

using namespace std::chrono_literals;

// A connected client socket to `path` (the test fails if it cannot connect) whose reads time out
// after 10 s, for tests that speak raw frames.
inline int connect_raw(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

inline std::string temp_dir() {
  std::string err;
  const std::string dir = outrun::cli::make_temp_dir("outrund-test", &err);
  REQUIRE_MESSAGE(!dir.empty(), err);
  return dir;
}

using outrun::cli::can_connect;  // host/cli/daemon_process.h

// The state letter of a process (/proc/PID/stat field 3): 'R' running, 'S' sleeping, 'T'
// stopped, 'Z' a zombie; '?' when there is no such process.
inline char proc_state(int pid) {
  std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(st, line)) return '?';
  const auto rp = line.rfind(')');
  return rp != std::string::npos && line.size() > rp + 2 ? line[rp + 2] : '?';
}

inline bool process_alive(int pid) {
  const char c = proc_state(pid);
  return c != '?' && c != 'Z';
}

// The daemon, started on a temporary socket; SIGKILLed if a test forgets to stop it.
struct Daemon {
  std::string dir, socket;
  pid_t pid = -1;                      // a test that reaps it itself sets -1
  outrun::cli::DaemonProcess process;  // host/cli/daemon_process.h, shared with `outrun drill`

  // `binary`: another outrund (measurements compare with an older build). `extra` may name its
  // own --worker (outrun-test-worker); `env`: changes to its environment ("NAME=VALUE" sets,
  // "NAME" removes), e.g. OUTRUN_TEST_FAULT.
  explicit Daemon(std::vector<std::string> extra = {}, std::string binary = OUTRUN_TEST_DAEMON,
                  std::vector<std::string> env = {}) {
    dir = temp_dir();
    socket = dir + "/outrund.sock";
    outrun::cli::DaemonLaunch launch;
    launch.binary = binary;
    launch.env = std::move(env);
    launch.args = {"--socket", socket, "--shards", "2"};
    if (std::find(extra.begin(), extra.end(), "--worker") == extra.end())
      launch.args.insert(launch.args.end(), {"--worker", OUTRUN_TEST_WORKER});
    if (std::find(extra.begin(), extra.end(), "--log-level") == extra.end())
      launch.args.insert(launch.args.end(), {"--log-level", "warn"});
    launch.args.insert(launch.args.end(), extra.begin(), extra.end());
    launch.socket = socket;
    launch.death_signal = SIGKILL;  // a test that aborts (a sanitizer report) leaves no daemon
    std::string err;
    const bool started = process.start(launch, &err);
    REQUIRE_MESSAGE(started, err);  // the daemon must not have died
    pid = process.pid();
  }
  // SIGTERM, then the exit status (-1 if it did not exit in 30 s).
  int stop() {
    if (pid < 0) return -1;
    // SIGTERM again every millisecond until it exits, as an impatient operator or a second
    // `systemctl stop` would: a stopping daemon ignores the repeats and still exits 0.
    const int status = process.stop(30s, 1ms).status();
    pid = -1;
    return status;
  }
  ~Daemon() {
    if (pid < 0) process.release();  // stopped, or reaped by the test
    process.kill_now();
    std::remove(socket.c_str());
    rmdir(dir.c_str());
  }
  std::unique_ptr<outrun::Client> client() const {
    outrun::ClientOptions o;
    o.socket = socket;
    std::unique_ptr<outrun::Client> c;
    outrun::Error e = outrun::Client::connect(o, &c);
    INFO(e.message);
    REQUIRE(!e);
    return c;
  }
  nlohmann::json stats() const {
    std::string s;
    REQUIRE(!client()->stats_json(&s));
    return nlohmann::json::parse(s);
  }
};

}  // namespace outrun::test
