// A worker process on POSIX (worker_os.h): uv_spawn in its own session and process group, the
// group's SIGKILL, its status page in /dev/shm, and its exit read from the signal that ended it.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstring>
#include <random>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/status_page.h"
#include "outrun/protocol/worker_exit.h"

namespace outrun::platform {

namespace bip = boost::interprocess;

namespace {

// A per-process unique name; /dev/shm entries are removed as soon as the worker has mapped it.
std::string page_name(int shard) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return "/outrun-" + std::to_string(getpid()) + "-" + std::to_string(shard) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + std::to_string(rng() & 0xffffff);
}

}  // namespace

HostStatusPage::HostStatusPage() = default;
HostStatusPage::~HostStatusPage() = default;

std::string HostStatusPage::create(int shard) {
  name_ = page_name(shard);
  try {
    bip::shared_memory_object shm(bip::create_only, name_.c_str(), bip::read_write,
                                  bip::permissions(0600));
    shm.truncate(protocol::kStatusPageSize);
    region_ =
        std::make_shared<bip::mapped_region>(shm, bip::read_write, 0, protocol::kStatusPageSize);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

void HostStatusPage::forget_name() {
  if (!name_.empty()) bip::shared_memory_object::remove(name_.c_str());
}

std::string spawn_worker(uv_loop_t* loop, ProcessHandle* process, uv_pipe_t* err_pipe,
                         ExitCallback on_exit, const SpawnRequest& request, WorkerChild* child) {
  std::vector<const char*> args = {request.path.c_str()};
  for (const std::string& a : request.args) args.push_back(a.c_str());
  args.push_back(nullptr);
  // The worker's stderr is a pipe the host reads and logs (bounded), never a file it could grow.
  uv_pipe_init(loop, err_pipe, 0);
  uv_stdio_container_t stdio[5];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_IGNORE;
  stdio[2].flags = static_cast<uv_stdio_flags>(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
  stdio[2].data.stream = reinterpret_cast<uv_stream_t*>(err_pipe);
  stdio[3].flags = UV_INHERIT_FD;
  stdio[3].data.fd = request.channels->worker_read;
  stdio[4].flags = UV_INHERIT_FD;
  stdio[4].data.fd = request.channels->worker_write;
  uv_process_options_t o{};
  o.file = request.path.c_str();
  o.args = const_cast<char**>(args.data());
  o.exit_cb = on_exit;
  o.flags = UV_PROCESS_DETACHED;  // setsid(): its own session and process group
  o.stdio_count = 5;
  o.stdio = stdio;
  o.env = request.env;  // null: the host's own environment
  const int rc = uv_spawn(loop, process, &o);
  if (rc != 0) return uv_strerror(rc);
  child->pid = process->pid;
  return {};
}

void close_process_handle(ProcessHandle* p, uv_close_cb cb) {
  uv_close(as_uv_handle(p), cb);
}

void release_worker(WorkerChild*) {}

void kill_worker(const WorkerChild& child) {
  if (child.pid > 0) kill(-child.pid, SIGKILL);  // its process group: anything it started too
}

ExitKind exit_kind(int64_t, int signal) {
  // Signals a process gets from its own faults or its own abort: how an interpreter bug that a
  // script reaches ends. Any other signal (SIGKILL, SIGTERM, ...) comes from outside -- an
  // operator, the OOM killer, a test -- and says nothing about the script that happened to run.
  switch (signal) {
    case 0:
      return ExitKind::kExited;
    case SIGSEGV:
    case SIGBUS:
    case SIGILL:
    case SIGFPE:
    case SIGABRT:
    case SIGSYS:
    case SIGTRAP:
      return ExitKind::kFault;
    default:
      return ExitKind::kKilled;
  }
}

std::string describe_exit(int64_t code, int signal) {
  if (signal == SIGSYS)
    return "was killed by signal " + std::to_string(signal) +
           " (Bad system call): it made a system call its seccomp filter forbids";
  if (signal != 0)
    return "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return protocol::describe_worker_exit(code);
}

}  // namespace outrun::platform
