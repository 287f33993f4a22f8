#include "profiler.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace outrun::perf {

CpuProfiler& CpuProfiler::get() {
  static CpuProfiler p;
  return p;
}

CpuProfiler::CpuProfiler() {
  setenv("CPUPROFILE_FREQUENCY", "1000", 0);  // 100 Hz (the default) gives too few samples
  void* lib = dlopen("libprofiler.so.0", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) lib = dlopen("libprofiler.so", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    why_ = "cannot load libprofiler.so.0 (Debian: libgoogle-perftools-dev)";
    return;
  }
  start_ = reinterpret_cast<int (*)(const char*)>(dlsym(lib, "ProfilerStart"));
  stop_ = reinterpret_cast<void (*)()>(dlsym(lib, "ProfilerStop"));
  if (!start_ || !stop_) {
    start_ = nullptr;
    why_ = "libprofiler has no ProfilerStart/ProfilerStop";
  }
}

bool CpuProfiler::start(const std::string& file) {
  return start_ && start_(file.c_str()) != 0;
}

void CpuProfiler::stop() {
  if (stop_) stop_();
}

std::string find_pprof() {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "";
  p += ":/usr/bin";
  for (const char* name : {"google-pprof", "pprof"}) {
    std::size_t start = 0;
    while (start <= p.size()) {
      const std::size_t end = std::min(p.find(':', start), p.size());
      const std::string candidate = p.substr(start, end - start) + "/" + name;
      if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
      start = end + 1;
    }
  }
  return "";
}

namespace {

bool has(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}
bool starts(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

bool is_lua(const std::string& s) {
  return starts(s, "lua") || starts(s, "luaL_") || starts(s, "l_alloc") ||
         starts(s, "index2value") || starts(s, "outrun::sandbox::") || has(s, "ScriptState");
}

bool is_syscall(const std::string& s) {
  static const std::array<const char*, 24> names = {"__GI___libc_write",
                                                    "__libc_write",
                                                    "write",
                                                    "__GI___libc_read",
                                                    "__libc_read",
                                                    "read",
                                                    "__send",
                                                    "send",
                                                    "__libc_send",
                                                    "__libc_recv",
                                                    "recv",
                                                    "epoll_wait",
                                                    "__GI_epoll_wait",
                                                    "epoll_pwait",
                                                    "clock_nanosleep",
                                                    "__GI___clock_nanosleep",
                                                    "__clock_nanosleep",
                                                    "__GI___poll",
                                                    "poll",
                                                    "syscall",
                                                    "__GI___writev",
                                                    "writev",
                                                    "__sendmsg",
                                                    "kill"};
  for (const char* n : names)
    if (s == n) return true;
  return starts(s, "__GI___libc_") || starts(s, "__libc_") || has(s, "nanosleep") ||
         has(s, "epoll");
}

bool is_sync(const std::string& s) {
  return has(s, "futex") || has(s, "lll_lock") || has(s, "lll_unlock") || has(s, "pthread_cond") ||
         has(s, "pthread_mutex") || has(s, "condition_variable") || starts(s, "std::mutex") ||
         has(s, "__GI___pthread");
}

bool is_alloc(const std::string& s) {
  return starts(s, "mi_") || starts(s, "_mi_") || s == "malloc" || s == "free" || s == "calloc" ||
         s == "realloc" || s == "cfree" || starts(s, "operator new") ||
         starts(s, "operator delete") || starts(s, "__libc_malloc") || starts(s, "_int_malloc") ||
         starts(s, "_int_free") || starts(s, "__GI___libc_free") || starts(s, "__GI___libc_malloc");
}

bool is_mem(const std::string& s) {
  return starts(s, "__memmove") || starts(s, "__memcpy") || starts(s, "__memset") ||
         starts(s, "memcpy") || starts(s, "memmove") || starts(s, "memset") ||
         starts(s, "__memcmp") || starts(s, "memcmp") || starts(s, "__strlen") ||
         starts(s, "strlen") || starts(s, "__memchr") || starts(s, "__GI_mem");
}

bool is_clock(const std::string& s) {
  return has(s, "clock_gettime") || has(s, "vdso") || has(s, "steady_clock");
}

}  // namespace

std::string component_of(const std::string& s, bool worker) {
  if (is_lua(s)) return worker ? "Lua (VM + sandbox)" : "Lua (InProcess)";
  if (starts(s, "flatbuffers::") || starts(s, "outrun::protocol::") ||
      starts(s, "outrun::wire::") || has(s, "encode_inputs") || has(s, "encode_value") ||
      has(s, "decode_value") || has(s, "build_evaluation") || has(s, "WireValueBuilder") ||
      has(s, "FrameReader") || has(s, "FrameWriter") || has(s, "verify_frame"))
    return "protocol (FlatBuffers, frames)";
  if (is_alloc(s)) return "allocator";
  if (is_sync(s)) return "sync (mutex/condvar/futex)";
  if (is_syscall(s)) return "kernel-ish (read/write/epoll/sleep syscalls)";
  if (is_clock(s)) return "clock reads";
  if (is_mem(s)) return "memcpy/memset";
  if (worker) {
    if (starts(s, "outrun::worker::") || starts(s, "main")) return "worker loop";
    if (starts(s, "spdlog::") || starts(s, "fmt::")) return "logging";
    return "other";
  }
  if (starts(s, "uv_") || starts(s, "uv__") || has(s, "Impl::on_poll") ||
      has(s, "Impl::read_worker") || has(s, "Impl::process_frames") ||
      has(s, "Impl::handle_results") || has(s, "Impl::flush_writer") ||
      has(s, "Impl::on_watchdog") || has(s, "Impl::arm_watchdog") || has(s, "Impl::on_wakeup") ||
      has(s, "Impl::deliver_all") || has(s, "Impl::deliver_from_loop") ||
      has(s, "Impl::end_slot") || has(s, "Impl::release_slot") || has(s, "Impl::place_promoted") ||
      has(s, "Impl::drain") || has(s, "Impl::run_commands") || has(s, "Impl::loop"))
    return "loop thread (libuv, reads, slots)";
  if (has(s, "Dispatcher") || has(s, "Completion") || has(s, "std::_Function_handler") ||
      has(s, "__future_base") || has(s, "std::promise") || has(s, "std::future"))
    return "dispatcher (callbacks, futures)";
  if (starts(s, "outrun::Host") || has(s, "Impl::submit") || has(s, "Impl::send_slots") ||
      has(s, "Impl::ensure_key") || has(s, "Impl::free_slot") || has(s, "Impl::deliver_now"))
    return "submit (caller thread, slots)";
  if (starts(s, "outrun::Value") || starts(s, "outrun::Input") || has(s, "variant") ||
      starts(s, "outrun::MapEntry"))
    return "values (inputs/results in C++)";
  if (starts(s, "outrun::perf::") || s == "main" || has(s, "outrun_perf") ||
      starts(s, "(anonymous namespace)"))
    return "harness (pacing, checks)";
  if (starts(s, "spdlog::") || starts(s, "fmt::")) return "logging";
  if (starts(s, "std::")) return "std (other)";
  return "other";
}

Ranking rank_profile(const std::string& pprof, const std::string& binary,
                     const std::string& profile, const std::string& text_out, bool worker) {
  Ranking r;
  const std::string cmd = "'" + pprof + "' --text '" + binary + "' '" + profile + "' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    r.error = "cannot run " + pprof;
    return r;
  }
  std::string text;
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  const int rc = pclose(p);
  std::ofstream(text_out) << text;
  std::map<std::string, long> by_component;
  std::vector<std::pair<std::string, long>> symbols;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    long flat = 0, cum = 0;
    double flat_pct = 0, sum_pct = 0, cum_pct = 0;
    int consumed = 0;
    if (line.rfind("Total:", 0) == 0) {
      std::sscanf(line.c_str(), "Total: %ld", &r.total_samples);
      continue;
    }
    if (std::sscanf(line.c_str(), " %ld %lf%% %lf%% %ld %lf%% %n", &flat, &flat_pct, &sum_pct, &cum,
                    &cum_pct, &consumed) < 5 ||
        consumed <= 0)
      continue;
    const std::string symbol = line.substr(static_cast<std::size_t>(consumed));
    by_component[component_of(symbol, worker)] += flat;
    symbols.emplace_back(symbol, flat);
  }
  if (r.total_samples <= 0) {
    r.error = rc != 0 ? "pprof failed (exit " + std::to_string(rc) + ")" : "no samples";
    return r;
  }
  const double total = static_cast<double>(r.total_samples);
  for (auto& [name, samples] : by_component)
    r.components.emplace_back(name, 100.0 * static_cast<double>(samples) / total);
  std::sort(r.components.begin(), r.components.end(),
            [](auto& a, auto& b) { return a.second > b.second; });
  std::sort(symbols.begin(), symbols.end(), [](auto& a, auto& b) { return a.second > b.second; });
  for (std::size_t i = 0; i < symbols.size() && i < 12; ++i)
    r.top.emplace_back(symbols[i].first, 100.0 * static_cast<double>(symbols[i].second) / total);
  return r;
}

}  // namespace outrun::perf
