// outrun-worker: runs scripts for one outrun host. Started by the host (uv_spawn, own process
// group) with its end of a socketpair as fd 3; not meant to be run by hand.
//
//   outrun-worker --fd 3 --host-pid PID [--memory-limit BYTES] [--status-page NAME]
//                 [--heartbeat-ms MS]
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "worker.h"

namespace {

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
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    unsigned long long n = 0;
    if (std::strcmp(a, "--fd") == 0 && parse_u64(v, &n) && n <= 1024) {
      opts.fd = static_cast<int>(n);
    } else if (std::strcmp(a, "--host-pid") == 0 && parse_u64(v, &n)) {
      host_pid = n;
    } else if (std::strcmp(a, "--memory-limit") == 0 && parse_u64(v, &n) && n > 0) {
      opts.memory_limit = static_cast<std::size_t>(n);
    } else if (std::strcmp(a, "--status-page") == 0 && v && *v) {
      page_name = v;
    } else if (std::strcmp(a, "--heartbeat-ms") == 0 && parse_u64(v, &n) && n > 0 && n <= 60000) {
      heartbeat_ms = n;
    } else {
      spdlog::error("usage: outrun-worker --fd N --host-pid PID [--memory-limit BYTES] (bad argument '{}')", a);
      return kExitUsage;
    }
    ++i;
  }

  // Die with the host. PDEATHSIG is armed only from here on, so check the host is still the
  // parent: if it died in between we were reparented and must not serve anybody.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (host_pid != 0 && static_cast<unsigned long long>(getppid()) != host_pid) return kExitOrphan;
  std::signal(SIGPIPE, SIG_IGN);
  // Nothing but stdio and the host's socket: fds the host process leaked without CLOEXEC are not
  // the worker's business.
  close_range(static_cast<unsigned>(opts.fd) + 1, ~0u, 0);
  for (int fd = 3; fd < opts.fd; ++fd) close(fd);

  // The status page: mapped before anything runs, so the host sees heartbeats from the start.
  std::unique_ptr<boost::interprocess::mapped_region> region;
  if (!page_name.empty()) {
    try {
      namespace bip = boost::interprocess;
      bip::shared_memory_object shm(bip::open_only, page_name.c_str(), bip::read_write);
      region = std::make_unique<bip::mapped_region>(shm, bip::read_write, 0, outrun::protocol::kStatusPageSize);
    } catch (const std::exception& e) {
      spdlog::error("cannot map status page '{}': {}", page_name, e.what());
      return kExitStatusPage;
    }
    opts.page = static_cast<outrun::protocol::StatusPage*>(region->get_address());
    if (opts.page->magic.load() != outrun::protocol::kStatusPageMagic) {
      spdlog::error("status page '{}' has no valid header", page_name);
      return kExitStatusPage;
    }
    // Liveness comes from this thread, not from the serving loop: a worker blocked writing
    // results to a slow host is alive; a stopped (SIGSTOP) or frozen process is not.
    auto* page = opts.page;
    page->heartbeat_ns.store(outrun::sandbox::monotonic_ns(), std::memory_order_relaxed);
    std::thread([page, heartbeat_ms] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(heartbeat_ms));
        page->heartbeat_ns.store(outrun::sandbox::monotonic_ns(), std::memory_order_relaxed);
      }
    }).detach();
  }

  if (const char* fault = std::getenv("OUTRUN_TEST_FAULT")) {
    if (std::strcmp(fault, "forget-scripts") == 0) opts.fault = TestFault::kForgetScripts;
    else if (std::strcmp(fault, "need-source-loop") == 0) opts.fault = TestFault::kNeedSourceLoop;
    if (opts.fault != TestFault::kNone) spdlog::warn("test fault '{}' is enabled", fault);
  }

  Worker worker(opts);
  const int rc = worker.run();
  std::fflush(stderr);
  _exit(rc);  // the heartbeat thread is detached; do not run static destructors under it
}
