#include "profiler.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

namespace outrun::perf {

CpuProfiler& CpuProfiler::get() {
  static CpuProfiler p;
  return p;
}

CpuProfiler::CpuProfiler() {
  setenv("CPUPROFILE_FREQUENCY", "1000", 0);  // the default 100 Hz gives too few samples
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

struct Frame {
  std::string file, func;
};

bool has(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}
bool starts(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// "__GI___libc_read" -> "read", "epoll_wait@@GLIBC_2.3.2" -> "epoll_wait".
std::string libc_name(std::string f) {
  if (auto at = f.find('@'); at != std::string::npos) f.resize(at);
  for (bool changed = true; changed;) {
    changed = false;
    for (const char* p : {"__GI_", "_", "GI_", "libc_"})
      if (starts(f, p) && f.size() > std::string(p).size()) {
        f.erase(0, std::string(p).size());
        changed = true;
      }
  }
  return f;
}

// What the leaf itself is when it is not the project's code: the kernel (a syscall), a futex, the
// allocator, memory functions, the clock. Empty otherwise.
std::string leaf_class(const Frame& leaf) {
  const std::string& f = leaf.func;
  const std::string n = libc_name(f);
  if (starts(f, "mi_") || starts(f, "_mi_") || has(leaf.file, "mimalloc") || n == "malloc" ||
      n == "free" || n == "calloc" || n == "realloc" || n == "cfree" || n == "int_malloc" ||
      n == "int_free" || starts(f, "operator new") || starts(f, "operator delete"))
    return "allocator";
  if (has(f, "futex") || has(f, "lll_") || has(f, "pthread_cond") || has(f, "pthread_mutex") ||
      has(f, "pthread_once"))
    return "futex, mutex, condvar";
  if (has(f, "clock_gettime") || has(f, "vdso")) return "clock reads";
  if (has(n, "memmove") || has(n, "memcpy") || has(n, "memset") || has(n, "memcmp") ||
      has(n, "strlen") || has(n, "strcmp") || has(n, "memchr"))
    return "memcpy, memcmp";
  static const std::array<const char*, 24> syscalls = {
      "read",      "write",  "send",       "recv",        "sendmsg",     "recvmsg",
      "readv",     "writev", "epoll_wait", "epoll_pwait", "epoll_ctl",   "clock_nanosleep",
      "nanosleep", "poll",   "ppoll",      "close",       "kill",        "tgkill",
      "madvise",   "munmap", "mmap",       "mprotect",    "sched_yield", "syscall"};
  for (const char* s : syscalls)
    if (n == s) return std::string("syscall ") + s;
  if (has(leaf.file, "sysdeps/unix/sysv/linux")) return "syscall " + n;
  if (has(f, "ProfileHandler") || has(f, "CpuProfiler") || has(leaf.file, "gperftools"))
    return "profiler itself";
  return "";
}

// The project component a frame belongs to, by its source path or name; empty for library and
// std frames (they count for their caller).
std::string frame_component(const Frame& fr) {
  const std::string& f = fr.func;
  const std::string& p = fr.file;
  if (starts(f, "lua") || has(p, "worker/sandbox") || has(p, "lua_values") ||
      has(p, "wire_values") || has(p, "/lua5.4/") || has(p, "host/src/in_process"))
    return "Lua (VM, sandbox, value conversion)";
  if (has(p, "/protocol/") || has(p, "flatbuffers") || has(p, "wire_codec") ||
      has(p, "outrun_generated") || starts(f, "flatbuffers::") || starts(f, "outrun::wire::") ||
      starts(f, "outrun::protocol::"))
    return "protocol (FlatBuffers, frames)";
  if (has(p, "host/src/submit.cpp")) return "slots and submit (submit.cpp)";
  if (has(p, "host/src/workers.cpp") || has(p, "host/src/supervise.cpp") || starts(f, "uv_") ||
      starts(f, "uv__"))
    return "loop (libuv, workers.cpp)";
  if (has(p, "host/src/completion")) return "dispatcher (completion.cpp)";
  if (has(p, "host/src/")) return "host (other)";
  if (has(p, "/worker/")) return "worker loop (worker.cpp)";
  if (has(p, "/perf/")) return "harness (pacing, inputs, checks)";
  if (starts(f, "spdlog::") || starts(f, "fmt::")) return "logging";
  return "";
}

std::string thread_role(const std::vector<Frame>& frames, ProcessKind kind) {
  bool main = false, floor = false;
  for (const Frame& fr : frames) {
    if (has(fr.func, "uv_run")) return "loop thread";
    if (has(fr.func, "Dispatcher::run")) return "dispatcher threads";
    if (has(fr.func, "libc_start")) main = true;
    if (has(fr.file, "perf/floors.cpp") || has(fr.file, "perf/redis_peer.cpp")) floor = true;
  }
  if (kind == ProcessKind::worker) return main ? "worker main thread" : "worker other threads";
  if (main) return "main thread (caller, pacing)";
  return floor ? "harness threads (epoll, dispatcher)" : "other threads (stack cut short)";
}

std::vector<std::pair<std::string, double>> sorted_pct(const std::map<std::string, long>& m,
                                                       double total) {
  std::vector<std::pair<std::string, double>> v;
  for (const auto& [k, n] : m) v.emplace_back(k, 100.0 * static_cast<double>(n) / total);
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return v;
}

}  // namespace

Ranking rank_profiles(const std::string& pprof, const std::string& binary,
                      const std::vector<std::string>& profiles, const std::string& text_out,
                      ProcessKind kind) {
  Ranking r;
  std::map<std::string, long> threads, components, leaves;
  std::map<std::string, std::map<std::string, long>> by_thread;
  std::ofstream text(text_out);
  static const std::regex frame_re(R"(^\s*(\d+)?\s+\(([0-9a-f]+)\)\s+(.*?):(\d+|\?+):(.*)$)");
  for (const std::string& profile : profiles) {
    const std::string cmd =
        "'" + pprof + "' --text --stacks '" + binary + "' '" + profile + "' 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) {
      r.error = "cannot run " + pprof;
      return r;
    }
    std::string out;
    std::array<char, 65536> buf;
    std::size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
    pclose(p);
    text << "==== " << profile << "\n" << out;

    long count = 0;
    std::vector<Frame> frames;
    auto flush = [&] {
      if (count <= 0 || frames.empty()) return;
      std::string comp = leaf_class(frames.front());
      if (comp.empty())
        for (const Frame& fr : frames)
          if (comp = frame_component(fr); !comp.empty()) break;
      if (comp.empty()) comp = "other (libraries)";
      const std::string role = thread_role(frames, kind);
      threads[role] += count;
      components[comp] += count;
      by_thread[role][comp] += count;
      leaves[frames.front().func] += count;
      r.total_samples += count;
    };
    std::istringstream in(out);
    std::string line;
    std::smatch m;
    while (std::getline(in, line)) {
      if (line.empty()) {
        flush();
        count = 0;
        frames.clear();
        continue;
      }
      if (!std::regex_match(line, m, frame_re)) continue;
      if (m[1].matched) {
        flush();
        frames.clear();
        count = std::stol(m[1].str());
      }
      frames.push_back({m[3].str(), m[5].str()});
    }
    flush();
  }
  if (r.total_samples <= 0) {
    r.error = "no samples (pprof could not read the profile?)";
    return r;
  }
  const double total = static_cast<double>(r.total_samples);
  r.threads = sorted_pct(threads, total);
  r.components = sorted_pct(components, total);
  for (const auto& [role, comps] : by_thread) r.by_thread[role] = sorted_pct(comps, total);
  r.top = sorted_pct(leaves, total);
  if (r.top.size() > 12) r.top.resize(12);
  return r;
}

}  // namespace outrun::perf
