#include "confine.h"

#include <seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <memory>

namespace outrun::worker {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define OUTRUN_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define OUTRUN_SANITIZED 1
#endif
#endif

bool built_with_sanitizer() {
#ifdef OUTRUN_SANITIZED
  return true;
#else
  return false;
#endif
}

namespace {

std::string errno_text(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

bool set_limit(int resource, rlim_t value, const char* name, std::string* error) {
  const rlimit r{value, value};
  if (setrlimit(resource, &r) == 0) return true;
  *error = errno_text(name, errno);
  return false;
}

// What a serving worker does, and the system calls it takes:
//   read frames, write results       read, recvfrom, write, writev, sendto
//   memory (mimalloc, Lua)           mmap/mprotect without PROT_EXEC, munmap, mremap, brk, madvise
//   clocks, heartbeat thread sleep   clock_gettime, clock_getres, gettimeofday, time,
//                                    clock_nanosleep, nanosleep
//   locks (glibc, mimalloc)          futex, sched_yield
//   status page RSS figure           getrusage
//   exit, abort()                    exit, exit_group, rt_sigprocmask, rt_sigreturn, getpid,
//                                    gettid, tgkill (of itself only)
//   fd housekeeping                  close, fstat
// Not allowed, among everything else: open/openat/creat, socket/connect/bind, clone/clone3/
// fork/vfork, execve/execveat, ptrace, kill (of others), mmap or mprotect with PROT_EXEC,
// ioctl, prctl, setrlimit/prlimit64, bpf, userfaultfd, perf_event_open, io_uring_*.
constexpr int kAllowed[] = {
    SCMP_SYS(read),
    SCMP_SYS(recvfrom),
    SCMP_SYS(write),
    SCMP_SYS(writev),
    SCMP_SYS(sendto),
    SCMP_SYS(munmap),
    SCMP_SYS(mremap),
    SCMP_SYS(brk),
    SCMP_SYS(madvise),
    SCMP_SYS(clock_gettime),
    SCMP_SYS(clock_getres),
    SCMP_SYS(gettimeofday),
    SCMP_SYS(time),
    SCMP_SYS(clock_nanosleep),
    SCMP_SYS(nanosleep),
    SCMP_SYS(futex),
    SCMP_SYS(sched_yield),
    SCMP_SYS(getrusage),
    SCMP_SYS(exit),
    SCMP_SYS(exit_group),
    SCMP_SYS(rt_sigprocmask),
    SCMP_SYS(rt_sigreturn),
    SCMP_SYS(getpid),
    SCMP_SYS(gettid),
    SCMP_SYS(close),
    SCMP_SYS(fstat),
    SCMP_SYS(restart_syscall),
};

// While a gperftools CPU profile is recorded (outrun-perf --profile): SIGPROF timer and the
// profile's already open file (written with write, closed with close).
// (mincore: its stack walker checks that a frame's page is mapped.)
constexpr int kAllowedProfiling[] = {SCMP_SYS(setitimer), SCMP_SYS(getitimer),
                                     SCMP_SYS(rt_sigaction), SCMP_SYS(mincore)};

// Sanitizer builds only (CI's ASan/TSan runs). Their runtimes make calls of their own while the
// worker serves (access, sigaltstack and mincore around longjmp, pipe2 for memory probes, ...),
// which differ between sanitizers and versions. There, a call off the allow-list fails with
// EPERM instead of killing, and what a break-out would need still kills explicitly:
constexpr int kKilledInSanitizerBuilds[] = {
    SCMP_SYS(open),      SCMP_SYS(openat),   SCMP_SYS(openat2),
    SCMP_SYS(creat),     SCMP_SYS(socket),   SCMP_SYS(socketpair),
    SCMP_SYS(connect),   SCMP_SYS(bind),     SCMP_SYS(clone),
    SCMP_SYS(clone3),    SCMP_SYS(fork),     SCMP_SYS(vfork),
    SCMP_SYS(execve),    SCMP_SYS(execveat), SCMP_SYS(ptrace),
    SCMP_SYS(kill),      SCMP_SYS(tkill),    SCMP_SYS(process_vm_writev),
    SCMP_SYS(setrlimit), SCMP_SYS(prlimit64)};

struct FilterDeleter {
  void operator()(void* ctx) const { seccomp_release(static_cast<scmp_filter_ctx>(ctx)); }
};

std::string install_filter(const ConfineOptions& o) {
  const bool lenient = built_with_sanitizer();
  std::unique_ptr<void, FilterDeleter> ctx(
      seccomp_init(lenient ? SCMP_ACT_ERRNO(EPERM) : SCMP_ACT_KILL_PROCESS));
  if (!ctx) return "seccomp_init failed";
  scmp_filter_ctx f = ctx.get();
  // Every thread, atomically: the heartbeat thread already runs.
  int rc = seccomp_attr_set(f, SCMP_FLTATR_CTL_TSYNC, 1);
  if (rc == 0) rc = seccomp_attr_set(f, SCMP_FLTATR_CTL_NNP, 1);
  for (int sc : kAllowed)
    if (rc == 0) rc = seccomp_rule_add(f, SCMP_ACT_ALLOW, sc, 0);
  if (lenient) {
    // ASan CHECK-fails unless this succeeds (asan_posix.cpp, on every longjmp = Lua error).
    if (rc == 0) rc = seccomp_rule_add(f, SCMP_ACT_ALLOW, SCMP_SYS(sigaltstack), 0);
    // TSan starts a background thread of its own inside the heartbeat thread's pthread_create,
    // and nothing waits for it: it may first run after the filter is loaded. glibc aborts a new
    // thread whose rseq registration fails ("Fatal glibc error: rseq registration failed"), so
    // its start-up calls must succeed. (Release workers start no thread after confinement.)
    if (rc == 0) rc = seccomp_rule_add(f, SCMP_ACT_ALLOW, SCMP_SYS(rseq), 0);
    if (rc == 0) rc = seccomp_rule_add(f, SCMP_ACT_ALLOW, SCMP_SYS(set_robust_list), 0);
    for (int sc : kKilledInSanitizerBuilds)
      if (rc == 0) rc = seccomp_rule_add(f, SCMP_ACT_KILL_PROCESS, sc, 0);
    if (rc == 0)
      rc = seccomp_rule_add(f, SCMP_ACT_KILL_PROCESS, SCMP_SYS(mmap), 1,
                            SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC));
    if (rc == 0)
      rc = seccomp_rule_add(f, SCMP_ACT_KILL_PROCESS, SCMP_SYS(mprotect), 1,
                            SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC));
    if (rc == 0)
      rc = seccomp_rule_add(f, SCMP_ACT_KILL_PROCESS, SCMP_SYS(tgkill), 1,
                            SCMP_A0(SCMP_CMP_NE, static_cast<scmp_datum_t>(getpid()), 0));
  }
  if (o.profiling)
    for (int sc : kAllowedProfiling)
      if (rc == 0) rc = seccomp_rule_add(f, SCMP_ACT_ALLOW, sc, 0);
  // Memory, but never executable memory: even a script that corrupted the VM cannot map code.
  if (rc == 0)
    rc = seccomp_rule_add(f, SCMP_ACT_ALLOW, SCMP_SYS(mmap), 1,
                          SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
  if (rc == 0)
    rc = seccomp_rule_add(f, SCMP_ACT_ALLOW, SCMP_SYS(mprotect), 1,
                          SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, 0));
  // abort() raises SIGABRT at itself; no other process may be signalled.
  if (rc == 0)
    rc = seccomp_rule_add(f, SCMP_ACT_ALLOW, SCMP_SYS(tgkill), 1,
                          SCMP_A0(SCMP_CMP_EQ, static_cast<scmp_datum_t>(getpid()), 0));
  if (rc != 0) return errno_text("building the seccomp filter", -rc);
  rc = seccomp_load(f);
  if (rc != 0) return errno_text("loading the seccomp filter", -rc);
  return {};
}

}  // namespace

std::string confine(const ConfineOptions& o) {
  std::string error;
  // No new fds: everything the worker keeps (stdio, the host's socket) is open already.
  if (!set_limit(RLIMIT_NOFILE, static_cast<rlim_t>(o.socket_fd) + 1, "RLIMIT_NOFILE", &error))
    return error;
  if (!set_limit(RLIMIT_NPROC, 0, "RLIMIT_NPROC", &error)) return error;
  // Its stderr is a pipe to the host, never a file: no file may grow (except, when profiling,
  // the profile opened before confinement).
  if (!o.profiling && !set_limit(RLIMIT_FSIZE, 0, "RLIMIT_FSIZE", &error)) return error;
  if (!set_limit(RLIMIT_CORE, 0, "RLIMIT_CORE", &error)) return error;
  if (o.address_space_limit != 0 && !built_with_sanitizer() &&
      !set_limit(RLIMIT_AS, static_cast<rlim_t>(o.address_space_limit), "RLIMIT_AS", &error))
    return error;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno_text("PR_SET_NO_NEW_PRIVS", errno);
  return install_filter(o);
}

}  // namespace outrun::worker
