// Clocks, on-CPU time of this process and of others, RSS, and the open-loop pacer.
//
// On-CPU time is what the harness quotes per unit of work (BRIEF §6): this process from
// CLOCK_PROCESS_CPUTIME_ID (every thread, ns), other processes from /proc/PID/task/*/schedstat
// (ns, every live thread; /proc/PID/stat in 10 ms ticks where schedstat is missing).
#pragma once

#include <time.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "latency_histogram.h"

namespace outrun::perf {

inline int64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// On-CPU time of this whole process (every thread), ns.
inline int64_t process_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Sleeps until the CLOCK_MONOTONIC time `t` (absolute: a late wake-up never shifts the next).
inline void sleep_until_ns(int64_t t) {
  timespec ts{static_cast<time_t>(t / 1'000'000'000), static_cast<long>(t % 1'000'000'000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

inline void sleep_ns(int64_t d) {
  sleep_until_ns(mono_ns() + d);
}

// One thread's scheduler statistics: on-CPU ns and times scheduled in (/proc/PID/task/TID/
// schedstat), and wake-ups: voluntary context switches (status), i.e. times it blocked (read,
// epoll_wait, futex, nanosleep) and was woken again. Preemptions are not wake-ups.
struct TaskStat {
  int tid = 0;
  int64_t cpu_ns = 0;
  int64_t slices = 0;
  int64_t wakeups = 0;
  int64_t preemptions = 0;  // involuntary context switches (status: nonvoluntary_ctxt_switches)
};
std::vector<TaskStat> task_stats(int pid);  // every live thread of `pid`

// On-CPU time of another process (all its live threads), ns; 0 when it is gone.
int64_t proc_cpu_ns(int pid);
inline int64_t procs_cpu_ns(const std::vector<int>& pids) {
  int64_t sum = 0;
  for (int pid : pids) sum += pid > 0 ? proc_cpu_ns(pid) : 0;
  return sum;
}
// Wake-ups (voluntary context switches), summed over every thread of `pids`.
int64_t procs_wakeups(const std::vector<int>& pids);

// On-CPU time and context switches (voluntary: wake-ups; involuntary: preemptions) of
// processes, summed over their live threads: take one before a window and subtract it from one
// after. A thread that ended inside the window is not counted.
struct ProcsCost {
  int64_t cpu_ns = 0, voluntary = 0, involuntary = 0;
  int64_t switches() const { return voluntary + involuntary; }
};
ProcsCost procs_cost(const std::vector<int>& pids);
inline ProcsCost operator-(const ProcsCost& a, const ProcsCost& b) {
  return {a.cpu_ns - b.cpu_ns, a.voluntary - b.voluntary, a.involuntary - b.involuntary};
}

// Resident set of a process, KB (VmRSS).
long rss_kb(int pid);

// A blocking stream socket connected to the Unix socket at `path` (CLOEXEC), or -1.
int connect_unix(const std::string& path);

// Open-loop pacing (no coordinated omission): send i is intended at t0 + i / rate, whatever
// happened to earlier sends. The pacing thread sleeps until each intended time (absolute
// clock_nanosleep) and, when late, sends back to back until it has caught up. Latency is taken
// from the intended time, so a stall of the system under test shows as latency of every send it
// delayed, not as one slow send. Sends before `first_measured` warm up and are not recorded.
class Paced {
 public:
  Paced(double rate, double warmup_s, double duration_s)
      : period_ns_(1e9 / rate),
        first_measured_(static_cast<int64_t>(std::ceil(warmup_s * rate))),
        total_(first_measured_ +
               std::max<int64_t>(1, static_cast<int64_t>(std::llround(duration_s * rate)))) {}

  int64_t total() const { return total_; }
  int64_t first_measured() const { return first_measured_; }
  int64_t measured() const { return total_ - first_measured_; }
  int64_t intended(int64_t i) const {
    return t0_.load(std::memory_order_relaxed) +
           static_cast<int64_t>(static_cast<double>(i) * period_ns_);
  }

  // Completion of send i (any thread): records its latency from the intended send time.
  void complete(int64_t i, bool correct) {
    const int64_t now = mono_ns();
    if (!correct) wrong_.fetch_add(1, std::memory_order_relaxed);
    if (i >= first_measured_) hist_.record(now - intended(i));  // lock-free
    done_.fetch_add(1, std::memory_order_release);
  }

  // Runs the pacing loop on this thread: send(i) for every i; window_start() right before the
  // first measured send. Then waits (polling, 100 µs) until every send completed or
  // `drain_timeout_ns` passed. Returns false on timeout.
  template <class Send, class Start>
  bool run(Send&& send, Start&& window_start, int64_t drain_timeout_ns = 10'000'000'000) {
    t0_.store(mono_ns() + 1'000'000, std::memory_order_relaxed);
    for (int64_t i = 0; i < total_; ++i) {
      sleep_until_ns(intended(i));
      if (i == first_measured_) window_start();
      send(i);
    }
    const int64_t deadline = mono_ns() + drain_timeout_ns;
    while (done_.load(std::memory_order_acquire) < total_) {
      if (mono_ns() > deadline) return false;
      sleep_ns(100'000);
    }
    return true;
  }

  const LatencyHistogram& histogram() const { return hist_; }
  int64_t wrong() const { return wrong_.load(); }
  int64_t done() const { return done_.load(); }

 private:
  double period_ns_;
  int64_t first_measured_;
  int64_t total_;
  std::atomic<int64_t> t0_{0};  // set by run(), read by completing threads
  LatencyHistogram hist_;
  std::atomic<int64_t> done_{0};
  std::atomic<int64_t> wrong_{0};
};

// A measured window: wall and on-CPU time of this process and of `pids` between start() and
// stop(), and wake-ups of both; per thread for this process.
struct Window {
  int64_t wall0 = 0, cpu0 = 0, others0 = 0, others_wakeups0 = 0;
  int64_t wall_ns = 0, cpu_ns = 0, others_ns = 0;
  int64_t wakeups = 0, others_wakeups = 0;
  std::vector<int> pids;
  std::vector<TaskStat> threads0, threads;  // this process: at start, then the differences

  void start();
  void stop();
  double cpu_pct() const {
    return wall_ns > 0 ? 100.0 * static_cast<double>(cpu_ns) / static_cast<double>(wall_ns) : 0;
  }
  double others_pct() const {
    return wall_ns > 0 ? 100.0 * static_cast<double>(others_ns) / static_cast<double>(wall_ns) : 0;
  }
};

inline double us(int64_t ns) {
  return static_cast<double>(ns) / 1e3;
}
inline double ms(int64_t ns) {
  return static_cast<double>(ns) / 1e6;
}

}  // namespace outrun::perf
