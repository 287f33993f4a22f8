// outrund's life: start (logs, fd limit, Host, tags engine, the listening socket, the loop's
// handles), serve, SIGHUP (logs, tags file), SIGTERM/SIGINT (drain, stop); the wake-ups from
// other threads; the heap collect after a burst (design/daemon.md "Shutdown and signals").
#include "server.h"

#include <grp.h>
#include <mimalloc.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "conn.h"
#include "log_ring.h"
#include "outrun/spdlog_sink.h"
#include "tags_file.h"
#include "tags_lane.h"

namespace outrun::daemon {

namespace {

void sd_notify(const char* msg) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (!path || !*path || std::strlen(path) >= sizeof(sockaddr_un::sun_path)) return;
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path, std::strlen(path));
  if (a.sun_path[0] == '@') a.sun_path[0] = 0;  // abstract namespace
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + std::strlen(path));
  (void)!::sendto(fd, msg, std::strlen(msg), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&a), len);
  ::close(fd);
}

bool mkdirs(const std::string& dir, mode_t mode) {
  if (dir.empty()) return true;
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  const auto slash = dir.rfind('/');
  if (slash != std::string::npos && slash > 0 && !mkdirs(dir.substr(0, slash), mode)) return false;
  return ::mkdir(dir.c_str(), mode) == 0 || errno == EEXIST;
}

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

}  // namespace

Server::Server(DaemonConfig cfg)
    : cfg_(std::move(cfg)),
      scripts_(RegistryQuota(cfg_.max_registry_bytes_per_uid ? cfg_.max_registry_bytes_per_uid
                                                             : cfg_.host.max_script_bytes / 2,
                             cfg_.max_registry_scripts_per_uid)),
      crash_budget_(
          CrashBudget::Limits{cfg_.max_crashes_per_uid, cfg_.crash_window, cfg_.crash_cooldown}),
      host_log_limit_(std::make_shared<LogRateLimit>(cfg_.crash_log_per_second,
                                                     std::chrono::steady_clock::now())) {
  script_log_budget_.limit = cfg_.max_log_bytes;
}

Server::~Server() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

// In server.cpp, not config.cpp: the fuzz target links the daemon without config.cpp.
std::string log_dir_problem(const std::string& log_file) {
  if (log_file.empty()) return {};
  const auto slash = log_file.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : log_file.substr(0, slash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "directory " + dir + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  return {};
}

void Server::reopen_logs() {
  std::shared_ptr<spdlog::logger> lg;
  try {
    if (cfg_.log_file.empty())
      lg = std::make_shared<spdlog::logger>(
          "outrund", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    else if (std::string why = log_dir_problem(cfg_.log_file); !why.empty())
      throw spdlog::spdlog_ex(why);  // spdlog would create the directory
    else
      lg = std::make_shared<spdlog::logger>(
          "outrund", std::make_shared<spdlog::sinks::basic_file_sink_mt>(cfg_.log_file));
  } catch (const spdlog::spdlog_ex& e) {
    spdlog::error("cannot open log file {}: {}", cfg_.log_file, e.what());
    return;
  }
  lg->set_level(spdlog::level::from_str(cfg_.log_level));
  lg->flush_on(spdlog::level::info);
  spdlog::set_default_logger(lg);
}

bool Server::open_socket(std::string* err) {
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

namespace {
// SIGTERM, SIGINT and SIGHUP reach only the loop thread, through its uv_signal handles: they are
// blocked before the host starts its threads, which inherit the mask, and unblocked on the loop
// thread once the handles are in place. finish() blocks them again before it closes the handles
// (libuv puts back the default action, "terminate", when a signal's last handle closes) and then
// ignores them, which also discards one that came in between: a repeated SIGTERM during the
// shutdown can never end the daemon half-way.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, sig);
  return set;
}
}  // namespace

int Server::run() {
  // This thread sets up; the Host's loop thread serves (start_serving) and takes the role then.
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  reopen_logs();
  const sigset_t stop = stop_signals();
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  started_ = std::chrono::steady_clock::now();
  {
    std::string why;
    if (!check_fd_limit(&why)) {
      spdlog::critical("{}", why);
      return 1;
    }
  }
  if (!mkdirs(cfg_.cache_dir, 0755))
    spdlog::warn("cannot create cache directory {}", cfg_.cache_dir);
  // The host logs through the daemon's logger (its level, its file), at most
  // crash_log_per_second lines a second: a client crashing workers in a loop must not flood the
  // log (the dropped lines are counted in one line a second).
  cfg_.host.log = [sink = spdlog_sink(spdlog::default_logger()), limit = host_log_limit_](
                      LogLevel level, std::string_view line) {
    const auto now = std::chrono::steady_clock::now();
    if (!limit->admit(now)) return;
    if (const uint64_t n = limit->take_report(now, std::chrono::seconds(1)))
      sink(LogLevel::warn, limit->report_line(n));
    sink(level, line);
  };
  if (cfg_.host.callbacks_on_loop) cfg_.host.after_loop_callbacks = [this] { corked_run_ended(); };
  if (Error e = Host::create(cfg_.host, &host_)) {
    spdlog::critical("cannot start the workers: {}", e.message);
    return 3;
  }
  counters_.shards = host_->shards();
  counters_.shard_latency = std::make_unique<LatencyHistogram[]>(counters_.shards);
  init_scheduler();
  auto stop_tags = [this] {
    {
      MutexLock lock(tq_mu_);
      tq_stop_ = true;
    }
    tags_stopping_.store(true, std::memory_order_release);
    tq_cv_.notify_all();
    { MutexLock lock(rq_mu_); }  // the read thread is waiting, or sees tags_stopping_
    rq_cv_.notify_all();
    if (tags_thread_.joinable()) tags_thread_.join();
    if (tags_read_thread_.joinable()) tags_read_thread_.join();
    tags_.reset();  // before the Host it runs on
    // After the engine: what it published last is committed.
    if (state_store_) state_store_->close();
  };
  {
    tags::TagsOptions to;
    to.on_change = [this](const std::vector<tags::Change>& ch) { on_tag_changes(ch); };
    to.max_tags = cfg_.max_tags;
    to.max_sources = cfg_.max_tag_sources;
    to.max_source_bytes = cfg_.max_tag_source_bytes;
    to.max_source_value_bytes = cfg_.max_tag_source_value_bytes;
    to.max_log_bytes = cfg_.max_log_bytes;
    to.on_log = [](std::string_view id, const std::vector<LogLine>& lines) {
      if (!spdlog::should_log(spdlog::level::debug)) return;
      for (const LogLine& l : lines)
        spdlog::debug("tag '{}': {}: {}", id, detail::script_level_name(l.level), l.text);
    };
    if (!cfg_.state_dir.empty() && !open_state_store(&to)) {
      destroy_host();
      return 1;
    }
    tags_runner_ = std::make_unique<TagsLane>(*this, *host_);
    if (Error e = tags::Engine::create(*tags_runner_, std::move(to), &tags_)) {
      spdlog::critical("cannot start the tags engine: {}", e.message);
      destroy_host();
      return 3;
    }
    // A broken tag gets BadConfigurationError and the others run (not strict). A file that
    // cannot be read as a whole (missing, TOML syntax, [defaults]) -- or any error, strict --
    // is a configuration error: exit 2 (the unit's RestartPreventExitStatus=2: no restart loop).
    if (!cfg_.tags_file.empty() && !apply_tags_file("start")) {
      stop_tags();
      destroy_host();
      return 2;
    }
    tags_thread_ = std::thread([this] { tags_thread_main(); });
    tags_read_thread_ = std::thread([this] { tags_read_thread_main(); });
  }
  std::string err;
  if (!open_socket(&err)) {
    spdlog::critical("{}", err);
    stop_tags();
    destroy_host();
    return 1;
  }
  // From here the loop thread -- the Host's -- owns the daemon's state: this thread only waits
  // until finish() has closed the daemon's handles, then stops the tags engine and the Host.
  if (!host_->post_to_loop([this](uv_loop_t* loop) { start_serving(loop); })) {
    spdlog::critical("the host stopped before the daemon could start serving");
    stop_tags();
    destroy_host();
    return 3;
  }
  {
    MutexLock lock(served_mu_);
    served_cv_.wait(served_mu_, [&]() REQUIRES(served_mu_) { return served_; });
  }
  // What is still in flight ends `cancelled` while the Host is destroyed; its callbacks write to
  // closed connections and drop the frames. The close callbacks of the daemon's handles run on
  // the loop before it ends.
  stop_tags();
  destroy_host();
  loop_thread.bind_to_current_thread();  // the loop thread has ended: the state is this one's
  loop_thread.assert_here();
  conns_.clear();
  spdlog::info("outrund stopped");
  spdlog::default_logger()->flush();
  return 0;
}

void Server::start_serving(uv_loop_t* loop) {
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  loop_ = loop;
  uv_poll_init(loop_, &listen_poll_, listen_fd_);
  listen_poll_.data = this;
  uv_poll_start(&listen_poll_, UV_READABLE, &Server::on_listen);
  life_.advance(Lifecycle::State::kListening);
  uv_async_init(loop_, &async_, &Server::on_async);
  async_.data = this;
  start_refill_check();
  {
    MutexLock lock(wake_mu_);
    wake_open_ = true;
  }
  for (auto [h, sig] : {std::pair{&sigterm_, SIGTERM}, {&sigint_, SIGINT}, {&sighup_, SIGHUP}}) {
    uv_signal_init(loop_, h);
    h->data = this;
    uv_signal_start(h, &Server::on_signal, sig);
  }
  // The Host's threads were started with the stop signals blocked (run()): on this one they are
  // handled now, one that came during start-up included.
  const sigset_t stop = stop_signals();
  pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
  uv_timer_init(loop_, &drain_timer_);
  drain_timer_.data = this;
  uv_timer_init(loop_, &hello_timer_);
  hello_timer_.data = this;
  uv_timer_init(loop_, &accept_pause_timer_);
  accept_pause_timer_.data = this;
  timers_ = true;
  {
    const auto every =
        std::clamp<int64_t>(cfg_.hello_timeout.count() / 4, 10, 1000);  // ms, late by 25% at most
    uv_timer_start(&hello_timer_, &Server::on_hello_timer, static_cast<uint64_t>(every),
                   static_cast<uint64_t>(every));
  }
  spdlog::info("outrund {} listening on {} (mode {:04o}), {} shards, pid {}", OUTRUN_VERSION,
               cfg_.socket, cfg_.socket_mode, host_->shards(), getpid());
  sd_notify("READY=1\nSTATUS=serving");
}

void Server::served() {
  MutexLock lock(served_mu_);
  served_ = true;
  served_cv_.notify_all();
}

void Server::wake() {
  MutexLock lock(wake_mu_);
  if (wake_open_) uv_async_send(&async_);
}

void Server::want_write(const std::shared_ptr<Conn>& c) {
  {
    MutexLock lock(wake_mu_);
    if (!wake_open_) return;
    want_write_.push_back(c);
  }
  wake();
}

void Server::on_async(uv_async_t* h) {
  auto* s = static_cast<Server*>(h->data);
  loop_thread.assert_here();
  std::vector<std::shared_ptr<Conn>> v;
  {
    MutexLock lock(s->wake_mu_);
    v.swap(s->want_write_);
  }
  for (auto& c : v) {
    if (c->phase.closed()) continue;
    if (c->over_limit.load(std::memory_order_relaxed)) {
      s->disconnect_over_limit(c.get());
      continue;
    }
    c->write_wait = true;  // its socket is full, or it went over its budget: watch it drain
    s->update_poll(c.get());
  }
}

void Server::on_signal(uv_signal_t* h, int sig) {
  auto* s = static_cast<Server*>(h->data);
  loop_thread.assert_here();
  if (sig == SIGHUP) {
    spdlog::info("SIGHUP: reopening logs");
    s->reopen_logs();
    s->note_sighup();
    // The reload waits for running waves and compiles in the workers: not on the loop.
    // Ahead of every queued definition, never refused (design/daemon.md "Tags").
    if (!s->cfg_.tags_file.empty()) s->request_reload();
    return;
  }
  s->begin_drain();
}

void Server::begin_drain() {
  const bool was_listening = life_.accepting();
  if (!life_.advance(Lifecycle::State::kDraining)) return;  // draining or finished already
  spdlog::info("stopping: no new connections; draining {} evaluations in flight (up to {} ms)",
               counters_.inflight.load(), cfg_.drain_timeout.count());
  sd_notify("STOPPING=1");
  if (was_listening) {
    uv_close(reinterpret_cast<uv_handle_t*>(&listen_poll_), nullptr);
    ::unlink(cfg_.socket.c_str());
  }
  for (auto& [p, c] : conns_) update_poll(p);  // not read any more (life_.accepting())
  drain_deadline_ = std::chrono::steady_clock::now() + cfg_.drain_timeout;
  uv_timer_start(&drain_timer_, &Server::on_drain_timer, 0, 5);
}

void Server::on_drain_timer(uv_timer_t* h) {
  auto* s = static_cast<Server*>(h->data);
  loop_thread.assert_here();
  bool pending_writes = false;
  for (auto& [p, c] : s->conns_) pending_writes |= c->write_wait;
  {
    // A writer that handed off but whose wake-up the loop has not run yet.
    MutexLock lock(s->wake_mu_);
    pending_writes |= !s->want_write_.empty();
  }
  const bool idle = s->counters_.inflight.load() == 0 && !pending_writes &&
                    s->tags_reads_.load(std::memory_order_acquire) == 0;
  if (idle || std::chrono::steady_clock::now() >= s->drain_deadline_) {
    if (!idle)
      spdlog::warn("drain deadline passed with {} evaluations in flight; they end cancelled",
                   s->counters_.inflight.load());
    s->finish();
  }
}

void Server::finish() {
  if (!life_.advance(Lifecycle::State::kFinished)) return;
  uv_timer_stop(&drain_timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&drain_timer_), nullptr);
  if (timers_) {
    timers_ = false;
    for (uv_timer_t* t : {&hello_timer_, &accept_pause_timer_}) {
      uv_timer_stop(t);
      uv_close(reinterpret_cast<uv_handle_t*>(t), nullptr);
    }
  }
  // Stopping already: a repeated SIGTERM or SIGINT (systemd's, a second Ctrl-C) is ignored from
  // here on, with no window in which it would meet the default action (see stop_signals()).
  const sigset_t stop = stop_signals();
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  for (uv_signal_t* h : {&sigterm_, &sigint_, &sighup_})
    uv_close(reinterpret_cast<uv_handle_t*>(h), nullptr);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) std::signal(sig, SIG_IGN);
  std::vector<Conn*> all;
  for (auto& [p, c] : conns_) all.push_back(p);
  for (Conn* c : all) close_conn(c, "daemon stopping");
  close_refill_check();
  {
    MutexLock lock(wake_mu_);
    wake_open_ = false;
    want_write_.clear();
    uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
  }
  served();
}

// What a burst freed on the loop thread (decoded inputs, the writers' queues) may wait in its
// mimalloc heap until the loop allocates again: collected (and decommitted, main.cpp's options)
// once the daemon went idle (nothing in flight) after evaluations ended.
void Server::maybe_trim() {
  if (counters_.inflight.load(std::memory_order_relaxed) != 0) return;
  uint64_t ended = 0;
  for (const auto& n : counters_.by_status) ended += n.load(std::memory_order_relaxed);
  if (ended == trimmed_at_) return;
  trimmed_at_ = ended;
  mi_collect(true);
  ++trims_;
}

// max_clients connections, max_pending_hello more before their hello, and a margin for the
// daemon's own fds (listening socket, loop, logs, each shard's sockets and pipes) must fit
// RLIMIT_NOFILE. The soft limit is raised up to the hard one if needed; past it, refuse.
bool Server::check_fd_limit(std::string* err) {
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

}  // namespace outrun::daemon
