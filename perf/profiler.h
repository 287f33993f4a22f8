// CPU profiles of the measured window only (BRIEF §6): gperftools' libprofiler, loaded with dlopen
// so outrun-perf has no link-time dependency on it, started and stopped around one window; then
// `google-pprof --text` and a ranking of the flat (self) samples by component.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace outrun::perf {

class CpuProfiler {
 public:
  // Loads libprofiler.so.0 once. Sets CPUPROFILE_FREQUENCY (default here 1000 Hz, unless the
  // environment has one) before loading: the profiler reads it when it initialises.
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

struct Ranking {
  long total_samples = 0;
  std::vector<std::pair<std::string, double>> components;  // name, % of samples, largest first
  std::vector<std::pair<std::string, double>> top;         // symbol, % of samples (flat)
  std::string error;                                       // when pprof could not be run
};

// google-pprof (or pprof) on PATH, empty when absent.
std::string find_pprof();
// Runs `pprof --text binary profile`, writes its output to `text_out`, ranks the flat samples.
// `worker`: the components of a worker process (Lua, sandbox, ...) instead of the host's.
Ranking rank_profile(const std::string& pprof, const std::string& binary,
                     const std::string& profile, const std::string& text_out, bool worker);
// Component of one symbol (exposed for the ranking's documentation and tests by eye).
std::string component_of(const std::string& symbol, bool worker);

}  // namespace outrun::perf
