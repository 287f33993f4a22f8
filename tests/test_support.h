// Helpers for tests that look at processes and file descriptors.
#pragma once

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace outrun::test {

// Sanitizer builds skip what needs RLIMIT_AS (their shadow memory reserves terabytes).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Runs `command` through the shell with stdin from /dev/null; its exit status (-1: it did not
// exit normally) and its stdout (add 2>&1 to the command for stderr too).
inline std::pair<int, std::string> run_command(const std::string& command) {
  std::pair<int, std::string> r{-1, {}};
  FILE* p = popen((command + " </dev/null").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.second.append(buf, n);
  const int st = pclose(p);
  r.first = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline std::size_t open_fd_count() {
  std::size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n - 1;  // the DIR's own fd
}

// Live (non-zombie) children of this process.
inline std::vector<int> child_pids() {
  std::vector<int> out;
  // Children of every thread: libuv spawns from the loop thread.
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream c(std::string("/proc/self/task/") + e->d_name + "/children");
      int pid;
      while (c >> pid) out.push_back(pid);
    }
    closedir(d);
  }
  return out;
}

}  // namespace outrun::test
