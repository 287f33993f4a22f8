// outrund's listening socket and its accepting (design/daemon.md "Owners", "Access",
// "Connections cannot starve the accept path"): the socket file made safely (its directory the
// daemon's, a stale socket removed, a live daemon's refused), each peer checked against
// allowed_uids/allowed_gids, and a pause when accept() finds no fd left (EMFILE/ENFILE). What it
// accepts goes to its owner's on_peer (the Server makes the connection).
#pragma once

#include <sys/types.h>
#include <uv.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "config.h"
#include "loop_thread.h"

namespace outrun::daemon {

// Makes `dir` and its missing parents with `mode`; true when it is a directory.
bool mkdirs(const std::string& dir, mode_t mode);

// A peer the Acceptor let in (its uid, gid or a supplementary group is allowed). `fd` is the
// receiver's (non-blocking, close-on-exec).
struct Peer {
  int fd = -1;
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
  bool admin = false;  // on admin_uids/admin_gids
};

class Acceptor {
 public:
  // The loop thread, once per accepted and allowed peer.
  using OnPeer = std::function<void(const Peer&)>;
  // `cfg` outlives the Acceptor.
  Acceptor(const DaemonConfig& cfg, OnPeer on_peer) : cfg_(cfg), on_peer_(std::move(on_peer)) {}
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // max_clients + max_pending_hello + a margin must fit RLIMIT_NOFILE: the soft limit is raised
  // up to the hard one if needed; false (with why) past it.
  static bool check_fd_limit(const DaemonConfig& cfg, std::string* err);
  // Makes the socket file (cfg.socket) and listens on it. False (with why): its directory is not
  // safe, the path is taken (not a socket, or a daemon answers there), or a call failed.
  bool open(std::string* err) REQUIRES(loop_thread);
  // Polls the socket on `loop` (and makes the pause timer there): accepting from here on.
  void start(uv_loop_t* loop) REQUIRES(loop_thread);
  // The drain: accepts no more; the poll is closed and the socket file removed.
  void stop() REQUIRES(loop_thread);
  // finish(): the handles still open are closed (their close callbacks run on the loop).
  void close() REQUIRES(loop_thread);

  // Not accepting for a while: accept() found no fd (EMFILE/ENFILE).
  bool paused() const REQUIRES(loop_thread) { return paused_; }
  // Peers refused as not allowed (stats' clients_refused, with the Server's max_clients ones).
  uint64_t refused() const REQUIRES(loop_thread) { return refused_; }
  int fd() const REQUIRES(loop_thread) { return listen_fd_; }

 private:
  static void on_listen(uv_poll_t* h, int status, int events);
  static void on_pause_end(uv_timer_t* h);
  void accept_all() REQUIRES(loop_thread);
  void pause(int err) REQUIRES(loop_thread);

  const DaemonConfig& cfg_;
  const OnPeer on_peer_;
  // Closed (made but not started), polling, stopped (the drain), closed (finish).
  enum class State { kIdle, kPolling, kStopped, kClosed };
  State state_ GUARDED_BY(loop_thread) = State::kIdle;
  int listen_fd_ GUARDED_BY(loop_thread) = -1;
  // The socket's poll and the pause's timer; made by start(), closed by stop() and close().
  uv_poll_t poll_{};
  uv_timer_t pause_timer_{};
  bool paused_ GUARDED_BY(loop_thread) = false;
  std::chrono::steady_clock::time_point last_warning_ GUARDED_BY(loop_thread){};
  uint64_t failures_ GUARDED_BY(loop_thread) = 0;  // EMFILE/ENFILE since the last warning
  uint64_t refused_ GUARDED_BY(loop_thread) = 0;
};

}  // namespace outrun::daemon
