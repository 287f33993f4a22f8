#include "daemon_process.h"

#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

extern char** environ;

namespace outrun::cli {

bool can_connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

namespace {

DaemonExit exit_of(int st) {
  DaemonExit e;
  if (WIFEXITED(st)) {
    e.kind = DaemonExit::kExited;
    e.code = WEXITSTATUS(st);
  } else if (WIFSIGNALED(st)) {
    e.kind = DaemonExit::kSignaled;
    e.code = WTERMSIG(st);
  }
  return e;
}

}  // namespace

std::string make_temp_dir(const std::string& prefix, std::string* err) {
  std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
  if (!mkdtemp(tmpl.data())) {
    *err = std::string("mkdtemp: ") + std::strerror(errno);
    return {};
  }
  return tmpl;
}

int DaemonExit::status() const {
  switch (kind) {
    case kExited:
      return code;
    case kSignaled:
      return 128 + code;
    default:
      return -1;
  }
}

std::string DaemonExit::describe() const {
  switch (kind) {
    case kExited:
      return "exit " + std::to_string(code);
    case kSignaled:
      return "killed by signal " + std::to_string(code);
    case kTimedOut:
      return "did not stop within " + std::to_string(limit.count() / 1000) +
             " s of SIGTERM; killed";
    default:
      return "not started";
  }
}

DaemonProcess::~DaemonProcess() {
  kill_now();
}

void DaemonProcess::kill_now() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

bool DaemonProcess::start(const DaemonLaunch& launch, std::string* err) {
  // Everything the child needs is built before fork: after it, in a process with threads, only
  // async-signal-safe calls.
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view var(*e);
    const std::string_view name = var.substr(0, var.find('='));
    bool changed = false;
    for (const std::string& c : launch.env)
      changed |= std::string_view(c).substr(0, c.find('=')) == name;
    if (!changed) env.emplace_back(var);
  }
  for (const std::string& c : launch.env)
    if (c.find('=') != std::string::npos) env.push_back(c);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args{launch.binary};
  args.insert(args.end(), launch.args.begin(), launch.args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    *err = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, launch.death_signal);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + launch.ready_timeout;
  for (;;) {
    if (can_connect(launch.socket)) return true;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      exit_ = exit_of(st);
      *err = "outrund exited at start (" + exit_.describe() + ")";
      return false;
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill_now();
  *err = "outrund did not listen on " + launch.socket + " within " +
         std::to_string(launch.ready_timeout.count() / 1000) + " s";
  return false;
}

DaemonExit DaemonProcess::stop(std::chrono::milliseconds limit, std::chrono::milliseconds resend) {
  if (pid_ <= 0) return exit_;
  const auto start = std::chrono::steady_clock::now();
  auto next_signal = start;
  const auto poll = resend.count() > 0 ? std::min(resend, std::chrono::milliseconds(10))
                                       : std::chrono::milliseconds(10);
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_signal) {
      kill(pid_, SIGTERM);
      next_signal =
          resend.count() > 0 ? now + resend : std::chrono::steady_clock::time_point::max();
    }
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      exit_ = exit_of(st);
      return exit_;
    }
    if (now - start >= limit) break;
    std::this_thread::sleep_for(poll);
  }
  kill_now();
  exit_ = {};
  exit_.kind = DaemonExit::kTimedOut;
  exit_.limit = limit;
  return exit_;
}

}  // namespace outrun::cli
