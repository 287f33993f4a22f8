// An outrund child process on a socket of its own: `outrun drill`'s private daemon and the daemon
// tests' (tests/daemon/daemon_support.h). Plain POSIX: no outrun library, no client.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace outrun::cli {

// Whether a Unix socket at `path` accepts a connection now.
bool can_connect(const std::string& path);

// A new directory /tmp/PREFIX-XXXXXX; "" (and why in *err) when it cannot be made.
std::string make_temp_dir(const std::string& prefix, std::string* err);

struct DaemonLaunch {
  std::string binary;             // outrund
  std::vector<std::string> args;  // its arguments, argv[0] excluded
  std::string socket;             // it is ready once this Unix socket accepts a connection
  // Its environment is this process's with these changes: "NAME=VALUE" sets, "NAME" removes.
  std::vector<std::string> env;
  int death_signal = SIGTERM;  // PR_SET_PDEATHSIG: what it gets should this thread's process die
  std::chrono::milliseconds ready_timeout{10'000};
};

// How the daemon ended.
struct DaemonExit {
  enum Kind { kNotStarted, kExited, kSignaled, kTimedOut } kind = kNotStarted;
  int code = 0;                        // kExited: the exit code; kSignaled: the signal
  std::chrono::milliseconds limit{0};  // kTimedOut: how long it had
  bool clean() const { return kind == kExited && code == 0; }
  // The exit code, 128 + the signal, or -1 (not started, or did not stop in time).
  int status() const;
  // "exit 0", "killed by signal 9", "did not stop within 30 s of SIGTERM; killed".
  std::string describe() const;
};

class DaemonProcess {
 public:
  DaemonProcess() = default;
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;
  // SIGKILL, should it still run (call stop() first to let it drain).
  ~DaemonProcess();

  // fork+exec (rather than posix_spawn, for PR_SET_PDEATHSIG: a caller that dies takes its daemon
  // with it), then waits until launch.socket accepts a connection. False, with why in *err, when
  // it could not be started, exited first ("outrund exited at start (exit 1)") or did not listen
  // in time (then it is killed).
  bool start(const DaemonLaunch& launch, std::string* err);

  // SIGTERM, sent again every `resend` if that is not zero (a stopping daemon must ignore the
  // repeats), until it exits or `limit` passed; then SIGKILL. Its end; again after the first time.
  DaemonExit stop(std::chrono::milliseconds limit = std::chrono::seconds(30),
                  std::chrono::milliseconds resend = std::chrono::milliseconds(0));

  // SIGKILL, should it still run, and reap it.
  void kill_now();
  // Forgets the process without signalling it: the caller has reaped it.
  void release() { pid_ = -1; }

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  DaemonExit exit_;
};

}  // namespace outrun::cli
