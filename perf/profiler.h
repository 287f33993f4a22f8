// CPU profiles of the measured window only (BRIEF §6): gperftools' libprofiler, loaded with dlopen
// so outrun-perf has no link-time dependency on it, started and stopped around one window; then
// `google-pprof --text --stacks` and a ranking of the samples by thread and by component.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace outrun::perf {

class CpuProfiler {
 public:
  // Loads libprofiler.so.0 once. Sets CPUPROFILE_FREQUENCY (1000 Hz unless the environment has
  // one) before loading: the profiler reads it when it initialises. ITIMER_PROF is checked on
  // the scheduler tick, so the effective rate is at most CONFIG_HZ per busy CPU.
  static CpuProfiler& get();
  bool available() const { return start_ != nullptr; }
  const std::string& why_unavailable() const { return why_; }
  bool start(const std::string& file);
  void stop();

 private:
  CpuProfiler();
  int (*start_)(const char*) = nullptr;
  void (*stop_)() = nullptr;
  std::string why_;
};

enum class ProcessKind { host, worker };

// Samples of one or more profiles, by thread role, by component, and both.
struct Ranking {
  long total_samples = 0;
  std::vector<std::pair<std::string, double>> threads;     // role, % of samples
  std::vector<std::pair<std::string, double>> components;  // component, % of samples
  std::map<std::string, std::vector<std::pair<std::string, double>>> by_thread;  // role -> comps
  std::vector<std::pair<std::string, double>> top;  // leaf functions (self), % of samples
  std::string error;
};

// google-pprof (or pprof) on PATH, empty when absent.
std::string find_pprof();

// Runs `pprof --text --stacks binary profile` for each profile (one at a time: profiles of
// different processes have different address layouts), appends the output to `text_out`, and
// ranks every sample: its thread role from the bottom of its stack (caller/main, loop thread,
// dispatcher, ...), its component from the leaf (a syscall, futex, the allocator, memcpy) or else
// from the nearest frame of the project's own code (by source path: protocol/, host/src/submit.cpp,
// host/src/workers.cpp, worker/, perf/, Lua).
Ranking rank_profiles(const std::string& pprof, const std::string& binary,
                      const std::vector<std::string>& profiles, const std::string& text_out,
                      ProcessKind kind);

}  // namespace outrun::perf
