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

#include "outrun/client.h"
#include "test_support.h"

namespace outrun::test {

using namespace std::chrono_literals;

inline std::string temp_dir() {
  char tmpl[] = "/tmp/outrund-test-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  return tmpl;
}

inline bool can_connect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

inline bool process_alive(int pid) {
  std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(st, line)) return false;
  const auto rp = line.rfind(')');
  return rp != std::string::npos && line.size() > rp + 2 && line[rp + 2] != 'Z';
}

// The daemon, started on a temporary socket; SIGKILLed if a test forgets to stop it.
struct Daemon {
  std::string dir, socket;
  pid_t pid = -1;

  // `binary`: another outrund (measurements compare with an older build).
  explicit Daemon(std::vector<std::string> extra = {}, std::string binary = OUTRUN_TEST_DAEMON) {
    dir = temp_dir();
    socket = dir + "/outrund.sock";
    std::vector<std::string> args{binary,     "--socket", socket, "--worker", OUTRUN_TEST_WORKER,
                                  "--shards", "2"};
    if (std::find(extra.begin(), extra.end(), "--log-level") == extra.end())
      args.insert(args.end(), {"--log-level", "warn"});
    args.insert(args.end(), extra.begin(), extra.end());
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that aborts (a sanitizer report) leaves no daemon
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 2000 && !can_connect(socket); ++i) {
      int st;
      REQUIRE(waitpid(pid, &st, WNOHANG) == 0);  // the daemon must not have died
      std::this_thread::sleep_for(5ms);
    }
    REQUIRE(can_connect(socket));
  }
  // SIGTERM, then the exit status (-1 if it did not exit in 30 s).
  int stop() {
    if (pid < 0) return -1;
    // SIGTERM again every millisecond until it exits, as an impatient operator or a second
    // `systemctl stop` would: a stopping daemon ignores the repeats and still exits 0.
    int st = 0;
    for (int i = 0; i < 30000; ++i) {
      kill(pid, SIGTERM);
      if (waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(1ms);
    }
    return -1;
  }
  ~Daemon() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
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
