// Accepting clients on the loop thread (design/daemon.md "Access", "Connections cannot starve
// the accept path"): SO_PEERCRED against allowed_uids/allowed_gids (and the admin lists),
// max_clients, max_pending_hello and hello_timeout, and a pause when accept() finds no fd.
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "conn.h"
#include "server.h"

namespace outrun::daemon {

namespace {

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

void Server::on_listen(uv_poll_t* h, int status, int) {
  auto* s = static_cast<Server*>(h->data);
  loop_thread.assert_here();
  if (status < 0) {
    spdlog::error("listening socket: {}", uv_strerror(status));
    return;
  }
  s->accept_all();
}

void Server::accept_all() {
  if (accept_paused_) return;
  for (int n = 0; n < 64; ++n) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        pause_accepting(errno);
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
      ++clients_refused_;
      spdlog::warn("refused a client: pid {} uid {} gid {} is not allowed", cred.pid, cred.uid,
                   cred.gid);
      reply_error_hello(fd, "permission denied: uid " + std::to_string(cred.uid) + " gid " +
                                std::to_string(cred.gid) + " is not allowed by outrund");
      ::close(fd);
      continue;
    }
    if (static_cast<int>(conns_.size() - pending_.size()) >= cfg_.max_clients) {
      ++clients_refused_;
      spdlog::warn("refused a client: {} clients connected (max_clients)",
                   conns_.size() - pending_.size());
      reply_error_hello(fd, "too many clients");
      ::close(fd);
      continue;
    }
    // Connections that have not said hello are bounded apart from max_clients: when there are
    // max_pending_hello of them, the oldest goes (an honest client says hello at once, so idle
    // connections cannot keep it out).
    if (static_cast<int>(pending_.size()) >= cfg_.max_pending_hello) {
      Conn* oldest = pending_.begin()->second;
      spdlog::debug("client {} closed: max_pending_hello reached", oldest->id);
      close_conn(oldest, "no hello (max_pending_hello)");
    }
    auto c = std::make_shared<Conn>(this, fd, next_conn_id_++);
    c->sched = std::make_unique<ConnShard[]>(static_cast<std::size_t>(host_->shards()));
    c->uid = cred.uid;
    c->gid = cred.gid;
    c->pid = cred.pid;
    c->admin = allowed(cfg_.admin_uids, cfg_.admin_gids, cred.uid, cred.gid, groups);
    c->accepted = std::chrono::steady_clock::now();
    uv_poll_init(loop_, &c->poll, fd);
    c->poll.data = c.get();
    conns_.emplace(c.get(), c);
    pending_.emplace(c->id, c.get());
    ++clients_total_;
    update_poll(c.get());
    spdlog::debug("client {} connected: pid {} uid {}", c->id, cred.pid, cred.uid);
  }
}

// accept() found no fd left (EMFILE: this process's RLIMIT_NOFILE; ENFILE: the system's). The
// connection stays in the backlog and the socket stays readable, so polling it again at once
// would spin: stop polling for 100 ms. Warned at most every 10 s, with the count since.
void Server::pause_accepting(int err) {
  ++accept_failures_;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_accept_warning_ >= std::chrono::seconds(10)) {
    spdlog::warn("accept: {} ({} times since the last warning); not accepting for 100 ms",
                 std::strerror(err), accept_failures_);
    last_accept_warning_ = now;
    accept_failures_ = 0;
  }
  if (!timers_ || !life_.accepting()) return;
  accept_paused_ = true;
  uv_poll_stop(&listen_poll_);
  uv_timer_start(&accept_pause_timer_, &Server::on_accept_pause, 100, 0);
}

void Server::on_accept_pause(uv_timer_t* h) {
  auto* s = static_cast<Server*>(h->data);
  loop_thread.assert_here();
  s->accept_paused_ = false;
  if (!s->life_.accepting()) return;
  uv_poll_start(&s->listen_poll_, UV_READABLE, &Server::on_listen);
  s->accept_all();
}

// Closes the connections that have not said hello within hello_timeout (oldest first: pending_
// is in accept order).
void Server::on_hello_timer(uv_timer_t* h) {
  auto* s = static_cast<Server*>(h->data);
  loop_thread.assert_here();
  const auto now = std::chrono::steady_clock::now();
  while (!s->pending_.empty()) {
    Conn* c = s->pending_.begin()->second;
    if (now - c->accepted < s->cfg_.hello_timeout) break;
    spdlog::debug("client {} (pid {}) sent no hello in {} ms; closed", c->id, c->pid,
                  s->cfg_.hello_timeout.count());
    s->close_conn(c, "no hello in time");
  }
  s->flush_subscribers();
  // Host log lines dropped in a burst that has ended (while it lasts, the lines that pass report
  // them).
  if (const uint64_t n = s->host_log_limit_->take_report(now, std::chrono::seconds(1)))
    spdlog::warn("{}", s->host_log_limit_->report_line(n));
  // A held client whose queue drained through producer passes (not the loop's flush) gets no
  // writable event: checked here too.
  std::vector<std::shared_ptr<Conn>> held;
  for (auto& [p, c] : s->conns_)
    if (c->held.load(std::memory_order_relaxed)) held.push_back(c);
  for (auto& c : held) s->maybe_resume(c.get());
  s->maybe_trim();
}

}  // namespace outrun::daemon
