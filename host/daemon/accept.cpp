// New connections on the loop thread (design/daemon.md "Access", "Connections cannot starve the
// accept path"): what the Acceptor let in, bounded by max_clients, max_pending_hello and
// hello_timeout.
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

// A peer the Acceptor let in: a connection, unless max_clients are connected (the oldest that has
// not said hello goes if max_pending_hello are waiting).
void Server::accept_peer(const Peer& p) {
  if (static_cast<int>(conns_.size() - pending_.size()) >= cfg_.max_clients) {
    ++clients_refused_;
    spdlog::warn("refused a client: {} clients connected (max_clients)",
                 conns_.size() - pending_.size());
    reply_error_hello(p.fd, "too many clients");
    ::close(p.fd);
    return;
  }
  // Connections that have not said hello are bounded apart from max_clients: when there are
  // max_pending_hello of them, the oldest goes (an honest client says hello at once, so idle
  // connections cannot keep it out).
  if (static_cast<int>(pending_.size()) >= cfg_.max_pending_hello) {
    Conn* oldest = pending_.begin()->second;
    spdlog::debug("client {} closed: max_pending_hello reached", oldest->id);
    close_conn(oldest, "no hello (max_pending_hello)");
  }
  auto c = std::make_shared<Conn>(this, p.fd, next_conn_id_++);
  c->sched = sched_->make_queues();
  c->uid = p.uid;
  c->gid = p.gid;
  c->pid = p.pid;
  c->admin = p.admin;
  c->accepted = std::chrono::steady_clock::now();
  uv_poll_init(loop_, &c->poll, p.fd);
  c->poll.data = c.get();
  conns_.emplace(c.get(), c);
  pending_.emplace(c->id, c.get());
  ++clients_total_;
  update_poll(c.get());
  spdlog::debug("client {} connected: pid {} uid {}", c->id, p.pid, p.uid);
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
  s->tags_.flush_subscribers();
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
