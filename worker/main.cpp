// outrun-worker: runs scripts for one outrun host. Started by the host through the platform seam
// (outrun/platform/worker_os.h: POSIX, uv_spawn in its own process group with its ends of two
// socketpairs as fds 3 and 4; Windows, in its own Job Object with its ends of two named pipes as
// inherited handles whose values --fd and --out-fd give); not meant to be run by hand.
//
//   outrun-worker --fd 3 [--out-fd 4] --host-pid PID [--memory-limit BYTES]
//                 [--script-budget BYTES] [--status-page NAME] [--heartbeat-ms MS]
//                 [--address-space-limit BYTES] [--profile FILE] [--compile-only 1]
//
// --compile-only 1: the host's compile-only process (compile_only.h): it compiles sources into
// bytecode and never runs a chunk; confined the same way.
//
// Start-up order: die-with-host, close stray fds, map the status page, start the heartbeat
// thread, a test build's hooks (hooks.h), (optionally) start the CPU profiler, then confine
// (confine.h) -- and only then read the first frame. A worker that cannot confine itself exits
// without serving.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#ifdef _WIN32
#include <windows.h>
// after windows.h
#include <psapi.h>
#else
#include <dlfcn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <boost/interprocess/mapped_region.hpp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "compile_only.h"
#include "confine.h"
#include "outrun/thread_annotations.h"
#include "worker.h"

namespace {

#ifndef _WIN32
// --profile PREFIX: gperftools' CPU profiler, written to PREFIX.<pid>.prof and loaded with dlopen,
// so production workers carry no profiler. The profile file is opened before confinement;
// samples are recorded only between SIGUSR1 (start) and SIGUSR2 (stop), so outrun-perf profiles
// exactly its measured window. The file is complete when the worker exits cleanly (Shutdown).
std::atomic<int> g_profile_recording{0};
struct ProfilerOptionsAbi {  // gperftools/profiler.h: struct ProfilerOptions
  int (*filter_in_thread)(void* arg);
  void* filter_in_thread_arg;
};
using ProfilerStartFn = int (*)(const char*, const ProfilerOptionsAbi*);
using ProfilerStopFn = void (*)();
ProfilerStopFn g_profiler_stop = nullptr;

bool start_profiler(const std::string& file) {
  void* lib = dlopen("libprofiler.so.0", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    spdlog::error("--profile: cannot load libprofiler.so.0 (Debian: libgoogle-perftools4): {}",
                  dlerror());
    return false;
  }
  auto start = reinterpret_cast<ProfilerStartFn>(dlsym(lib, "ProfilerStartWithOptions"));
  g_profiler_stop = reinterpret_cast<ProfilerStopFn>(dlsym(lib, "ProfilerStop"));
  if (!start || !g_profiler_stop) return false;
  struct sigaction sa {};
  sa.sa_handler = [](int sig) {
    g_profile_recording.store(sig == SIGUSR1 ? 1 : 0, std::memory_order_relaxed);
  };
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGUSR2, &sa, nullptr);
  static const ProfilerOptionsAbi options{
      [](void*) { return g_profile_recording.load(std::memory_order_relaxed); }, nullptr};
  if (!start(file.c_str(), &options)) {
    spdlog::error("--profile: cannot write '{}'", file);
    return false;
  }
  return true;
}
#else
// No gperftools profiler on Windows.
using ProfilerStopFn = void (*)();
ProfilerStopFn g_profiler_stop = nullptr;
bool start_profiler(const std::string&) {
  spdlog::error("--profile: not on Windows");
  return false;
}
#endif

bool parse_u64(const char* s, unsigned long long* out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace outrun::worker;
  auto logger = spdlog::stderr_logger_st("outrun-worker");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e outrun-worker[%P] %l: %v");
  spdlog::set_default_logger(logger);

  WorkerOptions opts;
  unsigned long long host_pid = 0;
  unsigned long long heartbeat_ms = 100;
  std::string page_name;
  std::string profile_file;
  unsigned long long address_space_limit = 0;
  bool compile_only = false;
  for (int i = 1; i < argc; i += 2) {  // --option value
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    unsigned long long n = 0;
    if (std::strcmp(a, "--fd") == 0 && parse_u64(v, &n) &&
        outrun::platform::channel_from_arg(n, &opts.fd)) {
    } else if (std::strcmp(a, "--out-fd") == 0 && parse_u64(v, &n) &&
               outrun::platform::channel_from_arg(n, &opts.out_fd)) {
    } else if (std::strcmp(a, "--host-pid") == 0 && parse_u64(v, &n)) {
      host_pid = n;
    } else if (std::strcmp(a, "--memory-limit") == 0 && parse_u64(v, &n) && n > 0) {
      opts.memory_limit = static_cast<std::size_t>(n);
    } else if (std::strcmp(a, "--script-budget") == 0 && parse_u64(v, &n) && n > 0) {
      opts.script_budget = static_cast<std::size_t>(n);
    } else if (std::strcmp(a, "--status-page") == 0 && v && *v) {
      page_name = v;
    } else if (std::strcmp(a, "--heartbeat-ms") == 0 && parse_u64(v, &n) && n > 0 && n <= 60000) {
      heartbeat_ms = n;
    } else if (std::strcmp(a, "--address-space-limit") == 0 && parse_u64(v, &n)) {
      address_space_limit = n;
    } else if (std::strcmp(a, "--compile-only") == 0 && v && std::strcmp(v, "1") == 0) {
      compile_only = true;
    } else if (std::strcmp(a, "--profile") == 0 && v && *v) {
      profile_file = v;
    } else {
      spdlog::error(
          "usage: outrun-worker --fd N --host-pid PID [--memory-limit BYTES] (bad argument '{}')",
          a);
      return exit_code(WorkerExit::kUsage);
    }
  }

#ifndef _WIN32
  // Die with the host. PDEATHSIG is armed only from here on, so check the host is still the
  // parent: if it died in between we were reparented and must not serve anybody.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (host_pid != 0 && static_cast<unsigned long long>(getppid()) != host_pid)
    return exit_code(WorkerExit::kOrphan);
  std::signal(SIGPIPE, SIG_IGN);
  // Nothing but stdio and the host's socket: fds the host process leaked without CLOEXEC are not
  // the worker's business.
  const int last_fd = std::max(opts.fd, opts.out_fd);
  close_range(static_cast<unsigned>(last_fd) + 1, ~0u, 0);
  for (int fd = 3; fd < last_fd; ++fd)
    if (fd != opts.fd && fd != opts.out_fd) close(fd);
#else
  // Windows: the host's Job Object (JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE) kills the worker when the
  // host's handle to it closes, the host's death included; the worker inherited only its two
  // pipe ends (PROC_THREAD_ATTRIBUTE_HANDLE_LIST), so there are no stray handles to close.
  (void)host_pid;
#endif

  // The status page: mapped before anything runs, so the host sees heartbeats from the start.
  std::unique_ptr<boost::interprocess::mapped_region> region;
  if (!page_name.empty()) {
    if (const std::string err = outrun::platform::map_status_page(page_name, &region);
        !err.empty()) {
      spdlog::error("cannot map status page '{}': {}", page_name, err);
      return exit_code(WorkerExit::kStatusPage);
    }
    opts.page = static_cast<outrun::protocol::StatusPage*>(region->get_address());
    if (opts.page->magic.load() != outrun::protocol::kStatusPageMagic) {
      spdlog::error("status page '{}' has no valid header", page_name);
      return exit_code(WorkerExit::kStatusPage);
    }
    // Liveness comes from this thread, not from the serving loop: a worker blocked writing
    // results to a slow host is alive; a stopped (SIGSTOP) or frozen process is not.
    auto* page = opts.page;
    page->heartbeat_ns.store(outrun::sandbox::monotonic_ns(), std::memory_order_relaxed);
    // The thread must be running before confinement: a starting thread makes system calls of
    // its own (rseq, set_robust_list) that the filter does not allow.
    // A mutex and a condition variable, not std::atomic<bool>::wait: libstdc++ 12's atomic wait
    // without a futex (MinGW) can miss the notify and wait forever; seen under
    // Wine as a worker that never sent its hello, about 1 start in 10. Static: the thread may
    // still be in notify_one when the wait has returned.
    static outrun::Mutex started_mu;
    static outrun::CondVar started_cv;
    static bool started = false;
    std::thread([page, heartbeat_ms] {
      auto publish_memory = [page] {
      // Peak, not current, resident set: the current figure needs /proc, which a confined
      // worker cannot open (the host reads /proc/PID/statm for it).
#ifdef _WIN32
        PROCESS_MEMORY_COUNTERS pmc{};
        if (GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof pmc))
          page->peak_rss_bytes.store(static_cast<uint64_t>(pmc.PeakWorkingSetSize),
                                     std::memory_order_relaxed);
#else
        rusage ru{};
        if (getrusage(RUSAGE_SELF, &ru) == 0)
          page->peak_rss_bytes.store(static_cast<uint64_t>(ru.ru_maxrss) * 1024,
                                     std::memory_order_relaxed);
#endif
      };
      publish_memory();
      {
        outrun::MutexLock lock(started_mu);
        started = true;
      }
      started_cv.notify_one();
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(heartbeat_ms));
        page->heartbeat_ns.store(outrun::sandbox::monotonic_ns(), std::memory_order_relaxed);
        publish_memory();
      }
    }).detach();
    outrun::MutexLock lock(started_mu);
    started_cv.wait(started_mu, [] { return started; });
  }

  // A test build's hooks (hooks.h): outrun-worker has none; outrun-test-worker reads its test
  // faults here, while it may still look at files.
  opts.hooks = start_hooks();

  // From here on the heartbeat thread runs: leave with _exit, never through static destructors.
  if (!profile_file.empty() &&
      !start_profiler(profile_file + "." + std::to_string(outrun::platform::current_pid()) +
                      ".prof"))
    _exit(exit_code(WorkerExit::kUsage));
    // The compile-only process is background work: bytecode for later restarts. At the lowest
    // priority it takes what the workers (and the host) leave of the CPU, never their share.
#ifdef _WIN32
  if (compile_only) SetPriorityClass(GetCurrentProcess(), IDLE_PRIORITY_CLASS);
  ConfineOptions confine_options;
#else
  if (compile_only) setpriority(PRIO_PROCESS, 0, 19);
  ConfineOptions confine_options;
  confine_options.socket_fd = last_fd;
#endif
  confine_options.address_space_limit = static_cast<std::size_t>(address_space_limit);
  confine_options.profiling = !profile_file.empty();
  if (const std::string err = confine(confine_options); !err.empty()) {
    spdlog::error("cannot confine the worker: {}", err);
    std::fflush(stderr);
    _exit(exit_code(WorkerExit::kConfine));
  }

  if (compile_only) {
    const int rc = run_compile_only(
        {opts.fd, opts.out_fd == outrun::platform::kNoChannel ? opts.fd : opts.out_fd,
         opts.memory_limit, opts.page, opts.hooks});
    std::fflush(stderr);
    _exit(rc);
  }
  Worker worker(opts);
  const int rc = worker.run();
  if (g_profiler_stop) g_profiler_stop();
  std::fflush(stderr);
  _exit(rc);  // the heartbeat thread is detached; do not run static destructors under it
}
