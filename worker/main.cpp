// outrun-worker: runs scripts for one outrun host. Started by the host (uv_spawn, own process
// group) with its end of a socketpair as fd 3; not meant to be run by hand.
//
//   outrun-worker --fd 3 --host-pid PID [--memory-limit BYTES]
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

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

  Worker worker(opts);
  return worker.run();
}
