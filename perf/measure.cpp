#include "measure.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace outrun::perf {

namespace {

// utime + stime from /proc/PID/stat, in ns (10 ms resolution).
int64_t stat_cpu_ns(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), {});
  const auto close = s.rfind(')');
  if (close == std::string::npos || close + 2 > s.size()) return 0;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return (utime + stime) * (1'000'000'000 / sysconf(_SC_CLK_TCK));
}

}  // namespace

int64_t proc_cpu_ns(int pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  int64_t sum = 0;
  bool any = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    FILE* f = std::fopen((dir + "/" + e->d_name + "/schedstat").c_str(), "r");
    if (!f) continue;
    long long on_cpu = 0;
    if (std::fscanf(f, "%lld", &on_cpu) == 1) {
      sum += on_cpu;
      any = true;
    }
    std::fclose(f);
  }
  closedir(d);
  return any ? sum : stat_cpu_ns(pid);
}

long rss_kb(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

}  // namespace outrun::perf
