// Helpers for tests that look at processes and file descriptors.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace outrun::test {

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
