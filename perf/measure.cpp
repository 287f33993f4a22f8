#include "measure.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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

std::vector<TaskStat> task_stats(int pid) {
  std::vector<TaskStat> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = dir + "/" + e->d_name;
    FILE* f = std::fopen((task + "/schedstat").c_str(), "r");
    if (!f) continue;
    long long on_cpu = 0, waiting = 0, slices = 0;
    const bool ok = std::fscanf(f, "%lld %lld %lld", &on_cpu, &waiting, &slices) == 3;
    std::fclose(f);
    if (!ok) continue;
    TaskStat t{std::atoi(e->d_name), on_cpu, slices, 0, 0};
    if (FILE* st = std::fopen((task + "/status").c_str(), "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, st))
        if (std::strncmp(line, "voluntary_ctxt_switches:", 24) == 0)
          t.wakeups = std::atoll(line + 24);
        else if (std::strncmp(line, "nonvoluntary_ctxt_switches:", 27) == 0)
          t.preemptions = std::atoll(line + 27);
      std::fclose(st);
    }
    out.push_back(t);
  }
  closedir(d);
  return out;
}

int64_t procs_wakeups(const std::vector<int>& pids) {
  int64_t sum = 0;
  for (int pid : pids)
    if (pid > 0)
      for (const TaskStat& t : task_stats(pid)) sum += t.wakeups;
  return sum;
}

ProcsCost procs_cost(const std::vector<int>& pids) {
  ProcsCost c;
  for (int pid : pids)
    if (pid > 0)
      for (const TaskStat& t : task_stats(pid)) {
        c.cpu_ns += t.cpu_ns;
        c.voluntary += t.wakeups;
        c.involuntary += t.preemptions;
      }
  return c;
}

void Window::start() {
  others0 = procs_cpu_ns(pids);
  others_wakeups0 = procs_wakeups(pids);
  threads0 = task_stats(getpid());
  cpu0 = process_cpu_ns();
  wall0 = mono_ns();
}

void Window::stop() {
  wall_ns = mono_ns() - wall0;
  cpu_ns = process_cpu_ns() - cpu0;
  const std::vector<TaskStat> end = task_stats(getpid());
  others_ns = procs_cpu_ns(pids) - others0;
  others_wakeups = procs_wakeups(pids) - others_wakeups0;
  threads.clear();
  wakeups = 0;
  for (const TaskStat& t : end) {
    TaskStat d = t;
    for (const TaskStat& b : threads0)
      if (b.tid == t.tid) {
        d.cpu_ns -= b.cpu_ns;
        d.slices -= b.slices;
        d.wakeups -= b.wakeups;
      }
    wakeups += d.wakeups;
    if (d.cpu_ns > 0) threads.push_back(d);
  }
}

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

int connect_unix(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

long rss_kb(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

}  // namespace outrun::perf
