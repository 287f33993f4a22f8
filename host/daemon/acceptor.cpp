// The listening socket and accepting (design/daemon.md "Owners", "Access", "Connections cannot
// starve the accept path"): the socket file, SO_PEERCRED against allowed_uids/allowed_gids (and
// the admin lists), and a pause when accept() finds no fd.
#include "acceptor.h"

#include <grp.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "conn.h"

namespace outrun::daemon {

bool mkdirs(const std::string& dir, mode_t mode) {
  if (dir.empty()) return true;
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  const auto slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0 && !mkdirs(dir.substr(0, slash), mode)) return false;
  return ::mkdir(dir.c_str(), mode) == 0 || errno == EEXIST;
}

namespace {

// The socket's directory must be the daemon's: a directory another user can write to (or owns)
// lets them replace the socket with their own listener, and every client's scripts and inputs
// go to them. Checked with lstat after it is created (or found): a real directory, not a
// symbolic link; owned by the daemon's uid (also root for a configured path); not group- or
// world-writable (a configured path may be a sticky directory such as /tmp). Returns why not,
// or empty.
std::string check_socket_dir(const std::string& dir, bool strict) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0)
    return "cannot check the socket directory " + dir + ": " + std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "the socket directory " + dir + " is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "the socket directory " + dir + " is not a directory";
  const uid_t me = ::geteuid();
  if (st.st_uid != me && (strict || st.st_uid != 0))
    return "the socket directory " + dir + " is owned by uid " + std::to_string(st.st_uid) +
           ", not by outrund's uid " + std::to_string(me) + (strict ? "" : " or root");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (strict || (st.st_mode & S_ISVTX) == 0)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return "the socket directory " + dir + " is writable by its group or by others (mode " + mode +
           ")";
  }
  return {};
}

// The peer's supplementary groups, from /proc/PID/status ("Groups:"), as the process has them
// (not as the group database says). The pid comes from SO_PEERCRED at accept: a process that
// exits at once could in principle be replaced by another with the same pid before this read
// (TOCTOU), so the line is only believed when the same file's "Uid:" line shows the peer's
// real uid. Empty when unreadable.
std::vector<gid_t> peer_groups(pid_t pid, uid_t uid) {
  std::vector<gid_t> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  bool uid_ok = false;
  std::vector<gid_t> groups;
  while (std::getline(in, line)) {
    if (line.rfind("Uid:", 0) == 0) {
      std::istringstream is(line.substr(4));
      unsigned long real = 0;
      uid_ok = (is >> real) && real == uid;
    } else if (line.rfind("Groups:", 0) == 0) {
      std::istringstream is(line.substr(7));
      unsigned long g;
      while (is >> g) groups.push_back(static_cast<gid_t>(g));
    }
  }
  if (uid_ok) out = std::move(groups);
  return out;
}

bool contains(const std::vector<uint32_t>& v, uint32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Whether uid, gid or one of the supplementary groups is on the lists.
bool allowed(const std::vector<uint32_t>& uids, const std::vector<uint32_t>& gids, uid_t uid,
             gid_t gid, const std::vector<gid_t>& groups) {
  if (contains(uids, uid) || contains(gids, gid)) return true;
  for (gid_t g : groups)
    if (contains(gids, g)) return true;
  return false;
}

}  // namespace

Acceptor::~Acceptor() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

bool Acceptor::open(std::string* err) {
  const std::string& path = cfg_.socket;
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    // The default directory ($XDG_RUNTIME_DIR/outrun, /tmp/outrun-UID, /run/outrun) is made
    // here, 0700 (0755 for root, whose socket_group clients must reach it), and must be ours
    // exactly; a configured one is made 0755 if missing, and may also be root's.
    const bool strict = cfg_.socket_is_default;
    const auto up = dir.rfind('/');
    const bool made =
        (up == std::string::npos || up == 0 || mkdirs(dir.substr(0, up), 0755)) &&
        (strict ? (::mkdir(dir.c_str(), ::geteuid() == 0 ? 0755 : 0700) == 0 || errno == EEXIST)
                : mkdirs(dir, 0755));
    if (!made) {
      *err = "cannot create the directory of " + path + ": " + std::strerror(errno);
      return false;
    }
    if (std::string why = check_socket_dir(dir, strict); !why.empty()) {
      *err = "refusing to start: " + why +
             " (another user could replace the socket; fix or remove it, or set daemon.socket)";
      return false;
    }
  }
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  // A socket file left by a daemon that died: remove it, unless a daemon still answers there.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      *err = path + " exists and is not a socket";
      return false;
    }
    int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool alive =
        probe >= 0 && ::connect(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (probe >= 0) ::close(probe);
    if (alive) {
      *err = "another daemon is listening on " + path;
      return false;
    }
    ::unlink(path.c_str());
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) {
    *err = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  // The file is created with the configured mode (no window with wider permissions).
  const mode_t old = ::umask(0777 & ~static_cast<mode_t>(cfg_.socket_mode));
  const int rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::umask(old);
  if (rc != 0) {
    *err = "bind " + path + ": " + std::strerror(errno);
    return false;
  }
  ::chmod(path.c_str(), static_cast<mode_t>(cfg_.socket_mode));
  if (!cfg_.socket_group.empty()) {
    gid_t gid = 0;
    char buf[4096];
    group gr{}, *found = nullptr;
    char* end = nullptr;
    const unsigned long num = std::strtoul(cfg_.socket_group.c_str(), &end, 10);
    if (::getgrnam_r(cfg_.socket_group.c_str(), &gr, buf, sizeof buf, &found) == 0 && found)
      gid = found->gr_gid;
    else if (*end == 0 && end != cfg_.socket_group.c_str())
      gid = static_cast<gid_t>(num);
    else {
      *err = "daemon.socket_group: no group named " + cfg_.socket_group;
      return false;
    }
    if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
      *err = "cannot give " + path + " to group " + cfg_.socket_group + ": " + std::strerror(errno);
      return false;
    }
  }
  if (::listen(listen_fd_, 128) != 0) {
    *err = std::string("listen: ") + std::strerror(errno);
    return false;
  }
  return true;
}

// max_clients connections, max_pending_hello more before their hello, and a margin for the
// daemon's own fds (listening socket, loop, logs, each shard's sockets and pipes) must fit
// RLIMIT_NOFILE. The soft limit is raised up to the hard one if needed; past it, refuse.
bool Acceptor::check_fd_limit(const DaemonConfig& cfg_, std::string* err) {
  const rlim_t margin = 64 + 8 * static_cast<rlim_t>(cfg_.host.shards);
  const rlim_t need =
      static_cast<rlim_t>(cfg_.max_clients) + static_cast<rlim_t>(cfg_.max_pending_hello) + margin;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return true;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
      *err = "RLIMIT_NOFILE is " + std::to_string(rl.rlim_cur) + " (hard " +
             std::to_string(rl.rlim_max) + "), but max_clients " +
             std::to_string(cfg_.max_clients) + " + max_pending_hello " +
             std::to_string(cfg_.max_pending_hello) + " + " + std::to_string(margin) +
             " for the daemon itself need " + std::to_string(need) +
             " file descriptors: lower daemon.max_clients or raise the limit (LimitNOFILE=)";
      return false;
    }
    const rlim_t old = rl.rlim_cur;
    rl.rlim_cur = need;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      *err = std::string("cannot raise RLIMIT_NOFILE to ") + std::to_string(need) + ": " +
             std::strerror(errno);
      return false;
    }
    spdlog::info("raised RLIMIT_NOFILE from {} to {} (max_clients + max_pending_hello + {})", old,
                 need, margin);
  }
  return true;
}

void Acceptor::start(uv_loop_t* loop) {
  uv_poll_init(loop, &poll_, listen_fd_);
  poll_.data = this;
  uv_poll_start(&poll_, UV_READABLE, &Acceptor::on_listen);
  uv_timer_init(loop, &pause_timer_);
  pause_timer_.data = this;
  state_ = State::kPolling;
}

void Acceptor::stop() {
  if (state_ != State::kPolling) return;
  state_ = State::kStopped;
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), nullptr);
  ::unlink(cfg_.socket.c_str());
}

void Acceptor::close() {
  stop();
  if (state_ != State::kStopped) return;
  state_ = State::kClosed;
  uv_timer_stop(&pause_timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&pause_timer_), nullptr);
}

void Acceptor::on_listen(uv_poll_t* h, int status, int) {
  auto* a = static_cast<Acceptor*>(h->data);
  loop_thread.assert_here();
  if (status < 0) {
    spdlog::error("listening socket: {}", uv_strerror(status));
    return;
  }
  a->accept_all();
}

void Acceptor::accept_all() {
  if (paused_ || state_ != State::kPolling) return;
  for (int n = 0; n < 64; ++n) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        pause(errno);
        return;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) spdlog::warn("accept: {}", std::strerror(errno));
      return;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      ::close(fd);
      continue;
    }
    // Supplementary groups are read only when a gid list could let the peer in.
    std::vector<gid_t> groups;
    const bool plain_ok =
        contains(cfg_.allowed_uids, cred.uid) || contains(cfg_.allowed_gids, cred.gid);
    if ((!plain_ok && !cfg_.allowed_gids.empty()) || !cfg_.admin_gids.empty())
      groups = peer_groups(cred.pid, cred.uid);
    if (!allowed(cfg_.allowed_uids, cfg_.allowed_gids, cred.uid, cred.gid, groups)) {
      ++refused_;
      spdlog::warn("refused a client: pid {} uid {} gid {} is not allowed", cred.pid, cred.uid,
                   cred.gid);
      reply_error_hello(fd, "permission denied: uid " + std::to_string(cred.uid) + " gid " +
                                std::to_string(cred.gid) + " is not allowed by outrund");
      ::close(fd);
      continue;
    }
    on_peer_(Peer{fd, cred.uid, cred.gid, cred.pid,
                  allowed(cfg_.admin_uids, cfg_.admin_gids, cred.uid, cred.gid, groups)});
    if (state_ != State::kPolling) return;  // on_peer stopped it
  }
}

// accept() found no fd left (EMFILE: this process's RLIMIT_NOFILE; ENFILE: the system's). The
// connection stays in the backlog and the socket stays readable, so polling it again at once
// would spin: stop polling for 100 ms. Warned at most every 10 s, with the count since.
void Acceptor::pause(int err) {
  ++failures_;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_warning_ >= std::chrono::seconds(10)) {
    spdlog::warn("accept: {} ({} times since the last warning); not accepting for 100 ms",
                 std::strerror(err), failures_);
    last_warning_ = now;
    failures_ = 0;
  }
  if (state_ != State::kPolling) return;
  paused_ = true;
  uv_poll_stop(&poll_);
  uv_timer_start(&pause_timer_, &Acceptor::on_pause_end, 100, 0);
}

void Acceptor::on_pause_end(uv_timer_t* h) {
  auto* a = static_cast<Acceptor*>(h->data);
  loop_thread.assert_here();
  a->paused_ = false;
  if (a->state_ != State::kPolling) return;
  uv_poll_start(&a->poll_, UV_READABLE, &Acceptor::on_listen);
  a->accept_all();
}

}  // namespace outrun::daemon
