#include "server.h"

#include <fcntl.h>
#include <flatbuffers/flatbuffers.h>
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
#include <bit>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "error_wire.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/frame_writer.h"
#include "outrun/spdlog_sink.h"
#include "script_pages.h"
#include "tags_file.h"
#include "tags_wire.h"
#include "wire_codec.h"

namespace outrun::daemon {

namespace wire = outrun::wire;
namespace protocol = outrun::protocol;

#ifndef OUTRUN_VERSION
#define OUTRUN_VERSION "0.0.0"
#endif

// ---------------------------------------------------------------------------------------------
// Connection

// One client. Shared by the loop (conns_, the poll handle) and every callback of an evaluation
// it submitted, so a result that arrives after the client left writes to a closed writer and
// is dropped; the fd is closed when the last reference goes (never reused under a writer).
struct Conn : std::enable_shared_from_this<Conn> {
  Conn(Server* s, int fd_, uint64_t id_)
      : server(s),
        fd(fd_),
        id(id_),
        writer(fd_, [this] { server->want_write(shared_from_this()); }) {}
  ~Conn() { ::close(fd); }

  Server* server;
  const int fd;
  const uint64_t id;
  protocol::FrameWriter writer;
  std::atomic<uint32_t> inflight{0};  // admitted: queued in the daemon or in the Host
  // Scheduler (design/daemon.md "Scheduler"): a queue per shard, each guarded by its shard's
  // ShardSched::mu. `held`: over max_client_queued_bytes, neither read nor fed until it drains
  // below half (set by the loop or a dispatcher, cleared by the loop). `over_limit`: past the
  // hard limit, the loop disconnects it.
  std::unique_ptr<ConnShard[]> sched;
  std::atomic<bool> held{false};
  std::atomic<bool> over_limit{false};

  // Loop thread only.
  uv_poll_t poll{};
  protocol::FrameReader reader GUARDED_BY(loop_thread);
  bool hello GUARDED_BY(loop_thread) = false;
  bool reading GUARDED_BY(loop_thread) = true;
  // The items of an Evaluate frame, handled up to paused_item when the client went over its
  // budget; the reader is not touched until it is finished (the frame stays valid).
  const flatbuffers::Vector<flatbuffers::Offset<wire::Evaluation>>* paused_frame
      GUARDED_BY(loop_thread) = nullptr;
  uint32_t paused_item GUARDED_BY(loop_thread) = 0;
  // What the rest of its inputs may decode to.
  std::size_t paused_budget GUARDED_BY(loop_thread) = 0;
  // Polling for writability (the socket was full).
  bool write_wait GUARDED_BY(loop_thread) = false;
  bool closing GUARDED_BY(loop_thread) = false;
  int events GUARDED_BY(loop_thread) = 0;
  uid_t uid GUARDED_BY(loop_thread) = 0;
  gid_t gid GUARDED_BY(loop_thread) = 0;
  pid_t pid GUARDED_BY(loop_thread) = 0;
  // May send KillShard/RestartShard (daemon.admin_uids, admin_gids).
  bool admin GUARDED_BY(loop_thread) = false;
  std::chrono::steady_clock::time_point accepted GUARDED_BY(loop_thread);
  std::string name GUARDED_BY(loop_thread);

  // Tags subscription (design/daemon.md "Subscribers"), guarded by Server::sub_mu_.
  bool gone = false;  // closed: never subscribed again
  bool sub_all = false;
  std::unordered_set<std::string> sub_ids;
  bool sub_overflow = false;  // over max_subscriber_bytes: only the latest value per tag is kept
  std::map<std::string, tags::DataValue> sub_latest;
};

namespace {

thread_local flatbuffers::FlatBufferBuilder t_fbb(4096);

void send_result(Conn& c, uint64_t id, const Result& r) {
  auto& f = t_fbb;
  f.Clear();
  const bool ok = r.status == Status::ok;
  const auto item = protocol::build_result(
      f, id, static_cast<wire::Status>(r.status),
      ok ? detail::encode_value(f, r.value) : flatbuffers::Offset<wire::Value>(),
      ok ? std::string_view() : std::string_view(r.error));
  c.writer.write(protocol::finish_results(f, {&item, 1}));
}

void reply_error_hello(int fd, const std::string& why) {
  flatbuffers::FlatBufferBuilder f(256);
  auto bytes = protocol::encode_server_hello(f, OUTRUN_VERSION, 0, 0, why);
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

uint64_t now_us() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

std::string hex(const std::array<uint8_t, 32>& h) {
  static const char* d = "0123456789abcdef";
  std::string s(64, '0');
  for (int i = 0; i < 32; ++i) {
    s[2 * i] = d[h[i] >> 4];
    s[2 * i + 1] = d[h[i] & 15];
  }
  return s;
}

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

// ---------------------------------------------------------------------------------------------
// Server

Server::Server(DaemonConfig cfg)
    : cfg_(std::move(cfg)),
      quota_(cfg_.max_registry_bytes_per_uid ? cfg_.max_registry_bytes_per_uid
                                             : cfg_.host.max_script_bytes / 2,
             cfg_.max_registry_scripts_per_uid) {}

Server::~Server() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void Server::reopen_logs() {
  std::shared_ptr<spdlog::logger> lg;
  try {
    if (cfg_.log_file.empty())
      lg = std::make_shared<spdlog::logger>(
          "outrund", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
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
  loop_thread.bind_to_current_thread();  // this thread runs the loop
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
  // The host logs through the daemon's logger (its level, its file).
  cfg_.host.log = spdlog_sink(spdlog::default_logger());
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
    tq_cv_.notify_all();
    if (tags_thread_.joinable()) tags_thread_.join();
    tags_.reset();  // before the Host it runs on
  };
  {
    tags::TagsOptions to;
    to.on_change = [this](const std::vector<tags::Change>& ch) { on_tag_changes(ch); };
    if (Error e = tags::Engine::create(*host_, std::move(to), &tags_)) {
      spdlog::critical("cannot start the tags engine: {}", e.message);
      host_.reset();
      return 3;
    }
    if (!cfg_.tags_file.empty()) {
      std::vector<tags::TagDefinition> defs;
      std::string why;
      Error e;
      if (!tags::file::load_tags_file(cfg_.tags_file, &defs, &why))
        e = Error{ErrorCode::invalid_argument, why};
      else
        e = tags_->apply(defs, /*replace_all=*/true);
      if (e) {
        spdlog::critical("tags file {}: {}", cfg_.tags_file, e.message);
        stop_tags();
        host_.reset();
        return 2;
      }
      spdlog::info("defined {} tags from {}", defs.size(), cfg_.tags_file);
    }
    tags_thread_ = std::thread([this] { tags_thread_main(); });
  }
  std::string err;
  if (!open_socket(&err)) {
    spdlog::critical("{}", err);
    stop_tags();
    host_.reset();
    return 1;
  }
  uv_loop_init(&loop_);
  loop_.data = this;
  uv_poll_init(&loop_, &listen_poll_, listen_fd_);
  listen_poll_.data = this;
  uv_poll_start(&listen_poll_, UV_READABLE, &Server::on_listen);
  listening_ = true;
  uv_async_init(&loop_, &async_, &Server::on_async);
  async_.data = this;
  {
    MutexLock lock(wake_mu_);
    wake_open_ = true;
  }
  for (auto [h, sig] : {std::pair{&sigterm_, SIGTERM}, {&sigint_, SIGINT}, {&sighup_, SIGHUP}}) {
    uv_signal_init(&loop_, h);
    h->data = this;
    uv_signal_start(h, &Server::on_signal, sig);
  }
  pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);  // one that came during start-up is handled now
  uv_timer_init(&loop_, &drain_timer_);
  drain_timer_.data = this;
  uv_timer_init(&loop_, &hello_timer_);
  hello_timer_.data = this;
  uv_timer_init(&loop_, &accept_pause_timer_);
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

  uv_run(&loop_, UV_RUN_DEFAULT);

  // Every handle is closed. Stop the tags engine, then the workers: what is still in flight ends
  // `cancelled`; its callbacks write to closed connections and drop the frames.
  stop_tags();
  host_.reset();
  conns_.clear();
  uv_loop_close(&loop_);
  spdlog::info("outrund stopped");
  spdlog::default_logger()->flush();
  return 0;
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
    if (c->closing) continue;
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
    // The reload waits for running waves and compiles in the workers: not on the loop.
    if (!s->cfg_.tags_file.empty() && !s->post_tags_job([s] { s->reload_tags(); }))
      spdlog::warn("SIGHUP: tags reload not started: the tags thread is busy");
    return;
  }
  s->begin_drain();
}

void Server::begin_drain() {
  if (draining_) return;
  draining_ = true;
  spdlog::info("stopping: no new connections; draining {} evaluations in flight (up to {} ms)",
               counters_.inflight.load(), cfg_.drain_timeout.count());
  sd_notify("STOPPING=1");
  if (listening_) {
    uv_close(reinterpret_cast<uv_handle_t*>(&listen_poll_), nullptr);
    listening_ = false;
    ::unlink(cfg_.socket.c_str());
  }
  for (auto& [p, c] : conns_) {
    c->reading = false;
    update_poll(p);
  }
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
  const bool idle = s->counters_.inflight.load() == 0 && !pending_writes;
  if (idle || std::chrono::steady_clock::now() >= s->drain_deadline_) {
    if (!idle)
      spdlog::warn("drain deadline passed with {} evaluations in flight; they end cancelled",
                   s->counters_.inflight.load());
    s->finish();
  }
}

void Server::finish() {
  if (finished_) return;
  finished_ = true;
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
  {
    MutexLock lock(wake_mu_);
    wake_open_ = false;
    want_write_.clear();
    uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
  }
}

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
    uv_poll_init(&loop_, &c->poll, fd);
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
  if (!timers_ || !listening_) return;
  accept_paused_ = true;
  uv_poll_stop(&listen_poll_);
  uv_timer_start(&accept_pause_timer_, &Server::on_accept_pause, 100, 0);
}

void Server::on_accept_pause(uv_timer_t* h) {
  auto* s = static_cast<Server*>(h->data);
  loop_thread.assert_here();
  s->accept_paused_ = false;
  if (!s->listening_) return;
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
  // A held client whose queue drained through producer passes (not the loop's flush) gets no
  // writable event: checked here too.
  std::vector<std::shared_ptr<Conn>> held;
  for (auto& [p, c] : s->conns_)
    if (c->held.load(std::memory_order_relaxed)) held.push_back(c);
  for (auto& c : held) s->maybe_resume(c.get());
  s->maybe_trim();
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

void Server::update_poll(Conn* c) {
  if (c->closing) return;
  int ev = 0;
  const bool held = c->held.load(std::memory_order_relaxed);
  if (c->write_wait)
    ev |= UV_WRITABLE;
  else if (c->reading && !held)
    ev |= UV_READABLE;  // a client that does not read its results is not read
  // Not read while over its budget: its disconnect is still seen (and cancels its queue).
  if (held) ev |= UV_DISCONNECT;
  if (ev == c->events) return;
  c->events = ev;
  if (ev == 0)
    uv_poll_stop(&c->poll);
  else
    uv_poll_start(&c->poll, ev, &Server::on_conn);
}

void Server::on_conn(uv_poll_t* h, int status, int events) {
  loop_thread.assert_here();
  auto* c = static_cast<Conn*>(h->data);
  c->server->conn_event(c, status, events);
}

void Server::conn_event(Conn* c, int status, int events) {
  if (c->closing) return;
  if (status < 0) {
    close_conn(c, uv_strerror(status));
    return;
  }
  auto self = conns_.at(c);
  if ((events & UV_DISCONNECT) && c->held.load(std::memory_order_relaxed)) {
    close_conn(c, "disconnected while over max_client_queued_bytes");
    return;
  }
  if (events & UV_WRITABLE) {
    switch (c->writer.flush_from_loop()) {
      case protocol::FrameWriter::Flush::kDone:
        c->write_wait = false;
        flush_subscriber(c);  // a subscriber that was over its budget gets its latest values
        break;
      case protocol::FrameWriter::Flush::kMore:
        break;
      case protocol::FrameWriter::Flush::kClosed:
        close_conn(c, "write failed");
        return;
    }
    if (c->held.load(std::memory_order_relaxed))
      maybe_resume(c);  // may keep write_wait, read frames, or close
    if (c->closing) return;
    update_poll(c);
  }
  if ((events & UV_READABLE) && c->reading && !c->held.load(std::memory_order_relaxed) &&
      !c->paused_frame) {
    const long n = c->reader.read_from(c->fd);
    if (n == -EAGAIN) return;
    if (n <= 0) {
      close_conn(c, n == 0 ? "disconnected" : std::strerror(static_cast<int>(-n)));
      return;
    }
    handle_frames(self);
  }
}

void Server::close_conn(Conn* c, const char* why) {
  if (c->closing) return;
  c->closing = true;
  c->writer.close();
  cancel_queued(c);
  {
    MutexLock lock(sub_mu_);
    c->gone = true;
    subscribers_.erase(c);
    c->sub_latest.clear();
  }
  spdlog::debug("client {} closed: {} ({} in flight dropped)", c->id, why, c->inflight.load());
  pending_.erase(c->id);
  auto it = conns_.find(c);
  // The poll handle lives in the Conn: keep the Conn until libuv is done with it.
  auto* keep = new std::shared_ptr<Conn>(it->second);
  conns_.erase(it);
  c->poll.data = keep;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->poll),
           [](uv_handle_t* h) { delete static_cast<std::shared_ptr<Conn>*>(h->data); });
}

void Server::handle_frames(const std::shared_ptr<Conn>& c) {
  protocol::FrameView fv;
  while (!c->closing) {
    if (c->held.load(std::memory_order_relaxed)) return;  // maybe_resume() goes on
    if (const auto* ev = c->paused_frame) {
      c->paused_frame = nullptr;
      if (!evaluate_items(c, ev, c->paused_item)) return;  // over its budget again
      continue;
    }
    // Every frame may be answered: none is handled while the client is over its budget.
    if (over_budget(*c)) {
      hold(c.get());
      return;
    }
    if (!c->reader.next(fv)) break;
    if (!handle_frame(c, fv.frame)) {
      ++violations_;
      spdlog::warn("client {} (pid {}) violated the protocol; disconnected", c->id, c->pid);
      close_conn(c.get(), "protocol violation");
      return;
    }
  }
  if (!c->closing && c->reader.error() != protocol::FrameError::kNone) {
    ++violations_;
    spdlog::warn("client {} (pid {}) sent a bad frame ({}); disconnected", c->id, c->pid,
                 protocol::to_string(c->reader.error()));
    close_conn(c.get(), "bad frame");
  }
}

bool Server::handle_frame(const std::shared_ptr<Conn>& c, const void* frame_ptr) {
  const auto* frame = static_cast<const wire::Frame*>(frame_ptr);
  flatbuffers::FlatBufferBuilder& f = t_fbb;
  protocol::ClientMessage msg;
  std::string why;
  if (!protocol::decode_client_frame(frame, &msg, &why)) return false;
  if (!c->hello) {
    const auto* h = std::get_if<protocol::ClientHelloMsg>(&msg);
    if (!h) return false;
    if (h->protocol_version != protocol::kProtocolVersion) {
      reply_error_hello(c->fd, "protocol version " + std::to_string(h->protocol_version) +
                                   " not supported; outrund speaks " +
                                   std::to_string(protocol::kProtocolVersion));
      return false;
    }
    c->hello = true;
    pending_.erase(c->id);
    c->name = std::string(h->client_name.substr(0, 64));
    f.Clear();
    c->writer.write(protocol::encode_server_hello(f, OUTRUN_VERSION, host_->shards(),
                                                  cfg_.max_inflight_per_client));
    return true;
  }
  switch (frame->body_type()) {
    case wire::Body::Register: {
      const auto& r = std::get<protocol::RegisterMsg>(msg);
      Script script;
      Error e;
      // A new record is charged to the peer's uid (D-quota); `admit` runs only for a new one.
      std::size_t charge = 0;
      auto admit = [&](std::size_t bytes) {
        loop_thread.assert_here();  // called by register_script below, on this thread
        Error q = quota_.admit(c->uid, bytes);
        if (!q) charge = bytes;
        return q;
      };
      if (!r.key || !r.source)
        e = Error{ErrorCode::invalid_argument, "register needs a key and a source"};
      else
        e = host_->register_script(*r.key, *r.source, &script, admit);
      uint32_t handle = 0;
      if (!e) {
        const uint32_t id = script.id();
        if (scripts_.size() <= id) scripts_.resize(id + 1);
        auto& slot = scripts_[id];
        if (!slot || !(slot->script == script)) {
          // A new record (an index whose entry is a tombstone, or a new one).
          auto entry = std::make_shared<ScriptEntry>();
          entry->gen = slot ? (slot->gen + 1) & ((1u << (32 - kHandleIdBits)) - 1) : 0;
          entry->key = script.key();
          entry->script = script;
          entry->uid = c->uid;
          entry->charge = charge;
          if (charge) quota_.charge(c->uid, charge);
          slot = std::move(entry);
          ++live_scripts_;
          key_entries_[script.key()].push_back(id);
        }
        handle = handle_of(*slot);
      }
      f.Clear();
      std::span<const uint8_t> sha;
      int shard = 0;
      if (!e) {
        sha = script.sha256();
        shard = static_cast<int>(script.shard());
      }
      c->writer.write(protocol::encode_registered(f, r.request_id, detail::wire_status(e.code),
                                                  e.message, handle, sha, shard));
      return true;
    }
    case wire::Body::Evaluate:
      evaluate_items(c, std::get<protocol::EvaluateMsg>(msg).items, 0);
      return true;
    case wire::Body::Unregister: {
      const auto& u = std::get<protocol::UnregisterMsg>(msg);
      Error e;
      if (!u.key) {
        e = Error{ErrorCode::invalid_argument, "unregister needs a key"};
      } else {
        e = host_->unregister_script(*u.key);
        if (!e) {
          // Every handle of the key this daemon gave out goes: the current one and those it
          // replaced. Their records are freed once their evaluations in flight end.
          if (auto it = key_entries_.find(*u.key); it != key_entries_.end()) {
            for (uint32_t id : it->second)
              if (scripts_[id]) drop_entry(*scripts_[id]);
            key_entries_.erase(it);
          }
          spdlog::info("client {} (pid {}): unregistered '{}'", c->id, c->pid,
                       u.key->substr(0, 256));
        }
      }
      f.Clear();
      c->writer.write(
          protocol::encode_unregistered(f, u.request_id, detail::wire_status(e.code), e.message));
      return true;
    }
    case wire::Body::Control: {
      const auto* ctl = &std::get<protocol::ControlMsg>(msg);
      Error e;
      std::string json;
      const bool admin_command = ctl->command == wire::ControlCommand::KillShard ||
                                 ctl->command == wire::ControlCommand::RestartShard;
      if (admin_command && !c->admin) {
        spdlog::warn("client {} (pid {} uid {}): {} refused: not an admin", c->id, c->pid, c->uid,
                     wire::EnumNameControlCommand(ctl->command));
        e = Error{ErrorCode::invalid_argument,
                  "permission denied: uid " + std::to_string(c->uid) +
                      " may evaluate but not administer outrund (daemon.admin_uids, admin_gids)"};
      } else
        switch (ctl->command) {
          case wire::ControlCommand::Stats:
            json = stats_json(false);
            break;
          case wire::ControlCommand::Shards:
            json = stats_json(true);
            break;
          case wire::ControlCommand::ListScripts:
            e = scripts_json(ctl->after, ctl->limit, &json);
            break;
          case wire::ControlCommand::KillShard:
            e = host_->kill_shard(ctl->shard);
            if (!e) spdlog::info("client {} (pid {}): kill shard {}", c->id, c->pid, ctl->shard);
            break;
          case wire::ControlCommand::RestartShard:
            e = host_->restart_shard(ctl->shard);
            if (!e) spdlog::info("client {} (pid {}): restart shard {}", c->id, c->pid, ctl->shard);
            break;
          default:
            e = Error{ErrorCode::invalid_argument, "unknown control command"};
        }
      // A document must fit one frame with room for the rest of the reply, or the client's
      // reader would drop the connection. A ListScripts page is cut well below (kMaxPageBytes);
      // this is the net under every document: refused instead, the connection goes on.
      if (constexpr std::size_t kMaxDocument = protocol::kMaxFrameSize - 4096;
          json.size() > kMaxDocument) {
        e = Error{ErrorCode::unavailable, "the document is " + std::to_string(json.size()) +
                                              " bytes, more than a reply frame holds (" +
                                              std::to_string(kMaxDocument) + ")"};
        json.clear();
      }
      f.Clear();
      c->writer.write(protocol::encode_control_reply(f, ctl->request_id,
                                                     detail::wire_status(e.code), e.message, json));
      return true;
    }
    case wire::Body::DefineTags:
    case wire::Body::RemoveTags:
    case wire::Body::ListTags:
    case wire::Body::SourceUpdates:
    case wire::Body::Subscribe:
    case wire::Body::ReadTags:
      return handle_tags_frame(c, frame);
    default:
      return false;  // a second hello (decode_client_frame refused a frame only the daemon sends)
  }
}

// ---------------------------------------------------------------------------------------------
// Evaluations: admission, the per-shard windows, cancellation and the byte budget
// (design/daemon.md "Scheduler").

bool Server::evaluate_items(const std::shared_ptr<Conn>& c, const void* items_ptr, uint32_t start) {
  const auto* items =
      static_cast<const flatbuffers::Vector<flatbuffers::Offset<wire::Evaluation>>*>(items_ptr);
  if (!items) return true;
  const uint64_t t0 = now_us();
  // What the inputs of this frame may decode to, shared subtrees counted per use: without it,
  // one small frame of shared subtrees could keep the loop decoding millions of values. Kept
  // across a pause, so a frame resumed in parts has one budget.
  if (start == 0) c->paused_budget = protocol::kMaxFrameSize;
  std::size_t& decode_budget = c->paused_budget;
  uint32_t admitted = 0;
  bool paused = false;
  const uint32_t n = items->size();
  for (uint32_t k = start; k < n; ++k) {
    const wire::Evaluation* e = items->Get(k);
    Result refused;
    refused.status = Status::ok;
    const uint32_t idx = e->script_id() & kHandleIdMask;
    const ScriptEntry* entry = idx < scripts_.size() ? scripts_[idx].get() : nullptr;
    if (!entry || entry->gen != e->script_id() >> kHandleIdBits) {
      refused = Result{Status::invalid_argument,
                       {},
                       "unknown script handle " + std::to_string(e->script_id()),
                       -1};
    } else if (!entry->script.valid()) {
      refused =
          Result{Status::invalid_argument, {}, "script '" + entry->key + "' was unregistered", -1};
    } else if (draining_) {
      refused = Result{Status::unavailable, {}, "outrund is stopping", -1};
    } else if (c->inflight.load(std::memory_order_relaxed) + admitted >=
               cfg_.max_inflight_per_client) {
      refused = Result{Status::busy,
                       {},
                       "too many evaluations in flight for this client (max_inflight_per_client)",
                       -1};
    }
    Inputs inputs;
    if (refused.status == Status::ok && e->inputs()) {
      inputs.reserve(e->inputs()->size());
      for (const wire::Input* in : *e->inputs()) {
        Value v;
        if (in->value() && !detail::decode_value(in->value(), &v, &decode_budget)) {
          refused = Result{Status::invalid_argument,
                           {},
                           decode_budget == 0
                               ? "the inputs of this frame decode to more than " +
                                     std::to_string(protocol::kMaxFrameSize) +
                                     " bytes (a shared subtree counts each time it is used)"
                               : "input '" + in->name()->str() + "' is not a valid value",
                           -1};
          break;
        }
        inputs.push_back(Input{in->name()->str(), std::move(v)});
      }
    }
    if (refused.status != Status::ok) {
      // An answer is written now: not while the client is over its budget (a frame of a million
      // refused evaluations would otherwise queue a million answers).
      if (over_budget(*c)) {
        c->paused_frame = items;
        c->paused_item = k;
        paused = true;
        break;
      }
      counters_.by_status[static_cast<int>(refused.status)].fetch_add(1, std::memory_order_relaxed);
      send_result(*c, e->id(), refused);
      continue;
    }
    const uint32_t shard = entry->script.shard();
    admit_[shard].push_back(
        Queued{Request{entry->script, std::move(inputs)}, scripts_[idx], e->id(), t0});
    ++admitted;
  }
  if (admitted > 0) {
    c->inflight.fetch_add(admitted, std::memory_order_relaxed);
    counters_.inflight.fetch_add(admitted, std::memory_order_relaxed);
    const bool held = c->held.load(std::memory_order_relaxed);
    for (std::size_t s = 0; s < admit_.size(); ++s) {
      std::vector<Queued>& add = admit_[s];
      if (add.empty()) continue;
      {
        ShardSched& sh = sched_[s];
        MutexLock lock(sh.mu);
        ConnShard& cs = c->sched[s];
        for (Queued& q : add) cs.q.push_back(std::move(q));
        sh.queued += add.size();
        if (!cs.in_ring && !held) {
          cs.in_ring = true;
          sh.ring.push_back(c.get());
        }
      }
      add.clear();
      refill(static_cast<int>(s), nullptr);
    }
  }
  if (paused) hold(c.get());
  return !paused;
}

void Server::init_scheduler() {
  const int n = host_->shards();
  sched_ = std::make_unique<ShardSched[]>(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    ShardSched& sh = sched_[i];
    MutexLock lock(sh.mu);  // no other thread has it yet: for the analysis
    sh.window = kWindowMin;
    sh.service_us = kWindowTargetUs / kWindowMin;
  }
  admit_.resize(static_cast<std::size_t>(n));
}

bool Server::over_budget(Conn& c) {
  const std::size_t q = c.writer.queued_bytes();
  uint64_t peak = queued_peak_bytes_.load(std::memory_order_relaxed);
  while (q > peak &&
         !queued_peak_bytes_.compare_exchange_weak(peak, q, std::memory_order_relaxed)) {
  }
  return q > cfg_.max_client_queued_bytes;
}

namespace {
// Statuses of evaluations a worker ran: only their durations say how long one takes.
bool ran_in_worker(Status s) {
  switch (s) {
    case Status::ok:
    case Status::compile_error:
    case Status::runtime_error:
    case Status::timeout:
    case Status::killed:
    case Status::memory_limit:
      return true;
    default:
      return false;
  }
}
}  // namespace

// Fills shard `s`'s window from the clients in turn, up to kQuantum each per turn, and submits
// what it took as one Host call (one frame to the worker where the Host can). `done`: called
// for a completion, whose window accounting happens here under the same lock; the window is then
// refilled only once a quarter of it is free (or it is empty), so completions that arrive one at
// a time still submit in runs.
void Server::refill(int s, const Done* done) {
  ShardSched& sh = sched_[s];
  std::shared_ptr<Run> run;
  std::vector<Request> batch;
  std::vector<std::shared_ptr<Conn>> newly_held;  // allocates only when one is
  {
    MutexLock lock(sh.mu);
    if (done) {
      --sh.used;
      if (done->ran) {
        // A worker runs its evaluations in order: this one started when it was sent or when the
        // previous one ended, whichever was later.
        const uint64_t began = std::max(done->sent_us, sh.last_done_us);
        const double sample =
            done->now_us > began ? static_cast<double>(done->now_us - began) : 0.0;
        sh.service_us += (sample - sh.service_us) / 8;
        const double w = kWindowTargetUs / std::max(sh.service_us, 1.0);
        sh.window = static_cast<uint32_t>(
            std::clamp(w, static_cast<double>(kWindowMin), static_cast<double>(kWindowMax)));
      }
      sh.last_done_us = std::max(sh.last_done_us, done->now_us);
      if (sh.used > 0 &&
          (sh.used >= sh.window || sh.window - sh.used < std::max<uint32_t>(1, sh.window / 4)))
        return;
    }
    if (sh.ring.empty() || sh.used >= sh.window) return;
    while (sh.used < sh.window && !sh.ring.empty()) {
      Conn* c = sh.ring.front();
      sh.ring.pop_front();
      ConnShard& cs = c->sched[s];
      if (c->held.load(std::memory_order_relaxed) || over_budget(*c)) {
        cs.in_ring = false;  // the loop puts it back when it resumes
        if (!c->held.exchange(true)) {
          held_total_.fetch_add(1, std::memory_order_relaxed);
          newly_held.push_back(c->shared_from_this());
        }
        continue;
      }
      if (!run) {
        run = std::make_shared<Run>();
        run->shard = s;
      }
      std::shared_ptr<Conn> self = c->shared_from_this();
      for (uint32_t k = 0; k < kQuantum && sh.used < sh.window && !cs.q.empty(); ++k) {
        Queued& q = cs.q.front();
        batch.push_back(std::move(q.rq));
        run->items.push_back(RunItem{self, std::move(q.entry), q.id, q.t0});
        cs.q.pop_front();
        ++sh.used;
        --sh.queued;
      }
      if (cs.q.empty())
        cs.in_ring = false;
      else
        sh.ring.push_back(c);
    }
    if (run) run->sent_us = now_us();
  }
  for (auto& c : newly_held) want_write(c);  // the loop stops reading it and watches it drain
  if (batch.empty()) return;
  if (batch.size() == 1) {
    host_->evaluate(batch[0].script, std::move(batch[0].inputs),
                    [this, run](Result r) { complete(*run, 0, std::move(r)); });
  } else {
    host_->evaluate_batch(std::move(batch), [this, run](std::size_t i, Result r) {
      complete(*run, i, std::move(r));
    });
  }
}

// A result: on the Host's loop thread (host.callbacks_on_loop, the default) or the dispatcher
// thread of its shard.
void Server::complete(const Run& run, std::size_t i, Result&& r) {
  const RunItem& it = run.items[i];
  Conn& c = *it.conn;
  const uint64_t now = now_us();
  const uint64_t us = now - it.t0;
  counters_.latency.record(us);
  counters_.shard_latency[run.shard].record(us);
  const int st = static_cast<int>(r.status);
  counters_.by_status[st].fetch_add(1, std::memory_order_relaxed);
  it.entry->by_status[st].fetch_add(1, std::memory_order_relaxed);
  // Released before the result is written: a client that sends its next evaluation as soon as
  // this one's result arrives is never counted over its limit (and answered busy).
  c.inflight.fetch_sub(1, std::memory_order_relaxed);
  counters_.inflight.fetch_sub(1, std::memory_order_relaxed);
  const bool ran = ran_in_worker(r.status);
  send_result(c, it.id, r);
  // Results of what is in the window still arrive while the client is held; past the hard limit
  // (a few huge results), the loop disconnects it.
  if (c.writer.queued_bytes() > kHardLimitFactor * cfg_.max_client_queued_bytes &&
      !c.over_limit.exchange(true))
    want_write(it.conn);
  const Done d{run.sent_us, now, ran};
  refill(run.shard, &d);
}

// Loop thread: the client is over its budget. Its frames are not handled (the one in progress
// waits in paused_frame), its socket is not read, its queued evaluations are not fed (the
// dispatchers drop it from their turns), until maybe_resume().
void Server::hold(Conn* c) {
  if (!c->held.exchange(true)) {
    held_total_.fetch_add(1, std::memory_order_relaxed);
    spdlog::debug(
        "client {}: over max_client_queued_bytes ({} bytes queued); not read until it "
        "drains",
        c->id, c->writer.queued_bytes());
  }
  c->write_wait = true;
  update_poll(c);
}

void Server::maybe_resume(Conn* c) {
  if (c->closing || !c->held.load(std::memory_order_relaxed)) return;
  if (c->writer.queued_bytes() > cfg_.max_client_queued_bytes / 2) {
    c->write_wait = true;  // keep watching it drain
    return;
  }
  c->held.store(false, std::memory_order_relaxed);
  for (int s = 0; s < host_->shards(); ++s) {
    bool any = false;
    {
      ShardSched& sh = sched_[s];
      MutexLock lock(sh.mu);
      ConnShard& cs = c->sched[s];
      if (!cs.in_ring && !cs.q.empty()) {
        cs.in_ring = true;
        sh.ring.push_back(c);
      }
      any = cs.in_ring;
    }
    if (any) refill(s, nullptr);
  }
  update_poll(c);
  handle_frames(conns_.at(c));  // the paused frame, then what was read
}

// Loop thread, when the connection closes: what it still has queued in the daemon ends
// `cancelled` at once (counted; nobody receives it) and is freed; what is in the Host finishes.
void Server::cancel_queued(Conn* c) {
  c->paused_frame = nullptr;
  if (!c->sched) return;
  uint64_t n = 0;
  for (int s = 0; s < counters_.shards; ++s) {
    std::deque<Queued> gone;
    {
      ShardSched& sh = sched_[s];
      MutexLock lock(sh.mu);
      ConnShard& cs = c->sched[s];
      if (cs.in_ring) {
        sh.ring.erase(std::find(sh.ring.begin(), sh.ring.end(), c));
        cs.in_ring = false;
      }
      gone.swap(cs.q);
      sh.queued -= gone.size();
    }
    for (const Queued& q : gone)
      q.entry->by_status[static_cast<int>(Status::cancelled)].fetch_add(1,
                                                                        std::memory_order_relaxed);
    n += gone.size();
  }
  if (n == 0) return;
  counters_.by_status[static_cast<int>(Status::cancelled)].fetch_add(n, std::memory_order_relaxed);
  c->inflight.fetch_sub(static_cast<uint32_t>(n), std::memory_order_relaxed);
  counters_.inflight.fetch_sub(n, std::memory_order_relaxed);
  spdlog::debug("client {}: {} queued evaluations cancelled", c->id, n);
}

// Loop thread: a dispatcher saw the client's unread answers pass the hard limit.
void Server::disconnect_over_limit(Conn* c) {
  over_limit_.fetch_add(1, std::memory_order_relaxed);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_limit_warning_ >= std::chrono::seconds(10)) {
    spdlog::warn(
        "client {} (pid {}) disconnected: {} bytes of answers unread, over {} × "
        "max_client_queued_bytes ({}){}",
        c->id, c->pid, c->writer.queued_bytes(), kHardLimitFactor, cfg_.max_client_queued_bytes,
        limit_warnings_skipped_
            ? " (" + std::to_string(limit_warnings_skipped_) + " more since the last warning)"
            : std::string());
    last_limit_warning_ = now;
    limit_warnings_skipped_ = 0;
  } else {
    ++limit_warnings_skipped_;
  }
  close_conn(c, "over the hard limit of queued answers");
}

namespace {
// Script keys come from clients and may be any bytes; dump() throws on invalid UTF-8, which on
// the loop thread would end the daemon. Invalid sequences become U+FFFD.
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json latency_json(const LatencyHistogram& h) {
  return nlohmann::json{
      {"count", h.count()},      {"p50", h.quantile(0.5)},    {"p90", h.quantile(0.9)},
      {"p99", h.quantile(0.99)}, {"p999", h.quantile(0.999)}, {"max", h.max()},
      {"sum", h.sum()}};
}
}  // namespace

namespace {
// Stats registry.quota: the per-uid limits and what each uid that holds a record is charged.
nlohmann::json quota_json(const RegistryQuota& q) {
  nlohmann::json uids = nlohmann::json::object();
  for (const auto& [uid, u] : q.uids())
    uids[std::to_string(uid)] = {{"scripts", u.scripts}, {"bytes", u.bytes}};
  return {{"bytes_per_uid", q.max_bytes()}, {"scripts_per_uid", q.max_scripts()}, {"uids", uids}};
}
}  // namespace

std::string Server::stats_json(bool shards_only) const {
  using nlohmann::json;
  json shards = json::array();
  uint64_t queued = 0;
  for (int i = 0; i < host_->shards(); ++i) {
    const ShardStats s = host_->shard_stats(i);
    json window;
    {
      ShardSched& sh = sched_[i];
      MutexLock lock(sh.mu);
      window = json{{"size", sh.window},
                    {"used", sh.used},
                    {"service_us", static_cast<uint64_t>(sh.service_us)},
                    {"queued", sh.queued},
                    {"clients", sh.ring.size()}};
      queued += sh.queued;
    }
    shards.push_back(
        json{{"index", s.index},
             {"state", s.state},
             {"pid", s.pid},
             {"uptime_s", s.uptime_ms < 0 ? -1.0 : static_cast<double>(s.uptime_ms) / 1000.0},
             {"starts", s.starts},
             {"restarts", s.starts > 0 ? s.starts - 1 : 0},
             {"deaths", s.deaths},
             {"death_causes",
              {{"killed_overrun", s.killed_overrun},
               {"killed_silence", s.killed_silence},
               {"killed_requested", s.killed_requested},
               {"crashed", s.crashed},
               {"exited", s.exited},
               {"protocol_violation", s.protocol_violations}}},
             {"crashes_charged", s.crashes_charged},
             {"quarantine_refusals", s.quarantine_refusals},
             {"last_death", s.last_death},
             {"evaluations", s.evaluations},
             {"retried", s.retried},
             {"worker_evaluations", s.worker_evaluations},
             {"worker_compiles", s.worker_compiles},
             {"worker_scripts", s.worker_scripts},
             {"worker_script_bytes", s.worker_script_bytes},
             {"worker_evictions", s.worker_evictions},
             {"rss_bytes", s.worker_rss_bytes},
             {"peak_rss_bytes", s.worker_peak_rss_bytes},
             {"heartbeat_age_ms", s.heartbeat_age_ms},
             {"latency_us", latency_json(counters_.shard_latency[i])},
             {"window", std::move(window)}});
  }
  if (shards_only) return dump(json{{"shards", shards}});
  json by_status = json::object();
  for (int i = 0; i < kStatusCount; ++i)
    by_status[std::string(to_string(static_cast<Status>(i)))] =
        counters_.by_status[i].load(std::memory_order_relaxed);
  const auto& h = counters_.latency;
  uint64_t held = 0, max_queued = 0;
  for (const auto& [p, c] : conns_) {
    held += c->held.load(std::memory_order_relaxed) ? 1 : 0;
    max_queued = std::max<uint64_t>(max_queued, c->writer.queued_bytes());
  }
  const RegistryStats reg = host_->registry_stats();
  json j{
      {"version", OUTRUN_VERSION},
      {"pid", getpid()},
      {"uptime_s",
       std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count()},
      {"clients", conns_.size()},
      {"clients_total", clients_total_},
      {"clients_refused", clients_refused_},
      {"client_protocol_violations", violations_},
      {"inflight", counters_.inflight.load(std::memory_order_relaxed)},
      {"queued", queued},
      {"clients_held", held},
      {"clients_held_total", held_total_.load(std::memory_order_relaxed)},
      {"clients_over_limit", over_limit_.load(std::memory_order_relaxed)},
      {"heap_collects", trims_},
      {"client_queued_bytes",
       {{"max", max_queued},
        {"peak", queued_peak_bytes_.load(std::memory_order_relaxed)},
        {"budget", cfg_.max_client_queued_bytes},
        {"limit", kHardLimitFactor * cfg_.max_client_queued_bytes}}},
      {"scripts", live_scripts_},
      {"registry", {{"scripts", reg.scripts}, {"bytes", reg.bytes}, {"quota", quota_json(quota_)}}},
      {"evaluations", by_status},
      {"latency_us", latency_json(h)},
      {"shards", shards}};
  return dump(j);
}

void Server::drop_entry(ScriptEntry& e) {
  if (!e.script.valid()) return;
  e.script = Script();
  --live_scripts_;
  if (e.charge) quota_.release(e.uid, e.charge);
  e.charge = 0;
}

Error Server::scripts_json(std::string_view after, uint32_t limit, std::string* out) const {
  PageCursor at;
  if (!decode_cursor(after, &at))
    return {ErrorCode::invalid_argument,
            "ListScripts: 'after' is not a cursor of this daemon (send the \"next\" of the "
            "previous page, or nothing for the first page)"};
  if (limit == 0) limit = kDefaultPageScripts;
  limit = std::min(limit, kMaxPageScripts);
  using nlohmann::json;
  // Room for the tail: ],"total":N,"next":"<cursor of up to 2 * 256 + 11 bytes>"}.
  constexpr std::size_t kTail = 1024;
  std::string& doc = *out;
  doc = "{\"scripts\":[";
  uint32_t n = 0;
  std::optional<std::string> next;
  auto it = at.key.empty() ? key_entries_.begin() : key_entries_.lower_bound(at.key);
  uint32_t skip = it != key_entries_.end() && it->first == at.key ? at.skip : 0;
  for (; it != key_entries_.end() && !next; ++it, skip = 0) {
    const std::vector<uint32_t>& ids = it->second;
    for (std::size_t i = skip; i < ids.size(); ++i) {
      const ScriptEntry& e = *scripts_[ids[i]];
      if (n == limit) {
        next = encode_cursor(it->first, static_cast<uint32_t>(i));
        break;
      }
      json by_status = json::object();
      uint64_t total = 0;
      for (int s = 0; s < kStatusCount; ++s) {
        const uint64_t k = e.by_status[s].load(std::memory_order_relaxed);
        total += k;
        if (k) by_status[std::string(to_string(static_cast<Status>(s)))] = k;
      }
      const ScriptCrashStats crashes = host_->script_crashes(e.script);
      const std::string item = dump(json{{"handle", handle_of(e)},
                                         {"key", e.script.key()},
                                         {"sha256", hex(e.script.sha256())},
                                         {"shard", e.script.shard()},
                                         {"evaluations", total},
                                         {"by_status", by_status},
                                         {"crashes", crashes.crashes},
                                         {"quarantined", crashes.quarantined}});
      if (n > 0 && doc.size() + 1 + item.size() + kTail > kMaxPageBytes) {
        next = encode_cursor(it->first, static_cast<uint32_t>(i));
        break;
      }
      if (n > 0) doc += ',';
      doc += item;
      ++n;
    }
  }
  doc += "],\"total\":" + std::to_string(live_scripts_) + ",\"next\":";
  doc += next ? "\"" + *next + "\"}" : "null}";
  return {};
}

}  // namespace outrun::daemon

// ---------------------------------------------------------------------------------------------
// Tags (design/protocol.md "Tags frames", design/daemon.md "Tags")

namespace outrun::daemon {

namespace {

// Changes are encoded with their own builder: on_tag_changes can run inside a frame's handling
// (an update whose wave completes at once), which uses t_fbb.
thread_local flatbuffers::FlatBufferBuilder t_changes_fbb(4096);

using ChangeRef = std::pair<const std::string*, const tags::DataValue*>;

// One TagChanges frame per ~4 MiB of changes, in order.
void write_changes(protocol::FrameWriter& w, const std::vector<ChangeRef>& items) {
  auto& f = t_changes_fbb;
  f.Clear();
  std::vector<flatbuffers::Offset<wire::TagValue>> offs;
  auto flush = [&] {
    if (offs.empty()) return;
    const auto frame = protocol::encode_tag_changes(f, offs);
    if (frame.size() <= protocol::kMaxFrameSize)
      w.write(frame);
    else
      spdlog::warn("a TagChanges frame of {} bytes was dropped (more than a frame holds)",
                   frame.size());
    offs.clear();
    f.Clear();
  };
  for (const auto& [tag, dv] : items) {
    offs.push_back(detail::encode_tag_entry(f, *tag, *dv));
    if (f.GetSize() > (4u << 20)) flush();
  }
  flush();
}

void write_tags_reply(protocol::FrameWriter& w, uint64_t request_id, const Error& e,
                      const std::string& json) {
  flatbuffers::FlatBufferBuilder f(256 + json.size());
  w.write(protocol::encode_tags_reply(f, request_id, detail::wire_status(e.code), e.message, json));
}

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

constexpr std::size_t kMaxTagsJobs = 64;
constexpr std::size_t kMaxSubscribedIds = 1u << 20;

}  // namespace

void Server::on_tag_changes(const std::vector<tags::Change>& changes) {
  MutexLock lock(sub_mu_);
  std::vector<ChangeRef> mine;
  for (auto& [p, c] : subscribers_) {
    mine.clear();
    for (const auto& ch : changes)
      if (c->sub_all || c->sub_ids.count(ch.tag)) mine.emplace_back(&ch.tag, &ch.value);
    if (mine.empty()) continue;
    if (!c->sub_overflow && c->writer.queued_bytes() > cfg_.max_subscriber_bytes) {
      c->sub_overflow = true;
      spdlog::debug("client {}: tags subscriber over max_subscriber_bytes; keeping latest values",
                    c->id);
    }
    if (c->sub_overflow) {
      for (const auto& [tag, dv] : mine) c->sub_latest[*tag] = *dv;
      continue;
    }
    write_changes(c->writer, mine);
  }
}

namespace {
// sub_mu_ held.
void flush_latest(Conn& c, std::size_t budget) {
  if (!c.sub_overflow || c.gone || c.writer.queued_bytes() > budget / 2) return;
  std::vector<ChangeRef> items;
  items.reserve(c.sub_latest.size());
  for (const auto& [tag, dv] : c.sub_latest) items.emplace_back(&tag, &dv);
  write_changes(c.writer, items);
  c.sub_latest.clear();
  c.sub_overflow = false;
}
}  // namespace

void Server::flush_subscriber(Conn* c) {
  MutexLock lock(sub_mu_);
  flush_latest(*c, cfg_.max_subscriber_bytes);
}

void Server::flush_subscribers() {
  MutexLock lock(sub_mu_);
  for (auto& [p, c] : subscribers_) flush_latest(*c, cfg_.max_subscriber_bytes);
}

bool Server::post_tags_job(std::function<void()> job) {
  {
    MutexLock lock(tq_mu_);
    if (tq_stop_ || tq_.size() >= kMaxTagsJobs) return false;
    tq_.push_back(std::move(job));
  }
  tq_cv_.notify_one();
  return true;
}

void Server::tags_thread_main() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(tq_mu_);
      tq_cv_.wait(tq_mu_, [&]() REQUIRES(tq_mu_) { return tq_stop_ || !tq_.empty(); });
      if (tq_stop_) return;  // what is left is for connections that are closed by now
      job = std::move(tq_.front());
      tq_.pop_front();
    }
    job();
  }
}

void Server::reload_tags() {
  std::vector<tags::TagDefinition> defs;
  std::string why;
  if (!tags::file::load_tags_file(cfg_.tags_file, &defs, &why)) {
    spdlog::error("SIGHUP: tags file {}: {}; the running tags are kept", cfg_.tags_file, why);
    return;
  }
  if (Error e = tags_->apply(defs, /*replace_all=*/true)) {
    spdlog::error("SIGHUP: tags file {}: {}: {}; the running tags are kept", cfg_.tags_file,
                  to_string(e.code), e.message);
    return;
  }
  spdlog::info("SIGHUP: defined {} tags from {}", defs.size(), cfg_.tags_file);
}

std::string Server::tags_list_json() const {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const std::string& id : tags_->ids()) {
    tags::TagInfo info;
    if (tags_->info(id, &info)) continue;  // removed meanwhile
    nlohmann::ordered_json d = tags::file::definition_to_json(info.definition);
    nlohmann::ordered_json j;
    j["id"] = id;
    for (const char* k :
         {"type", "trigger", "period_ms", "max_age_ms", "timestamps", "inputs", "keep_state"})
      if (d.contains(k)) j[k] = d[k];
    j["value"] = tags::file::change_to_json(id, info.value);
    const tags::TagCounters& tc = info.counters;
    nlohmann::ordered_json by_status = nlohmann::ordered_json::object();
    for (int i = 0; i < kStatusCount; ++i)
      if (tc.by_status[i])
        by_status[std::string(to_string(static_cast<Status>(i)))] = tc.by_status[i];
    j["counters"] = {{"evaluations", tc.evaluations},
                     {"by_status", by_status},
                     {"coalesced", tc.coalesced},
                     {"busy", tc.busy},
                     {"changes", tc.changes},
                     {"last_error", tc.last_error},
                     {"last_duration_us", tc.last_duration.count()}};
    j["version"] = info.version;
    arr.push_back(std::move(j));
  }
  return dump_json(nlohmann::ordered_json{{"tags", arr}});
}

bool Server::handle_tags_frame(const std::shared_ptr<Conn>& c, const void* frame_ptr) {
  const auto* frame = static_cast<const wire::Frame*>(frame_ptr);
  protocol::ClientMessage msg;
  std::string why;
  if (!protocol::decode_client_frame(frame, &msg, &why)) return false;
  auto refuse_admin = [&](uint64_t rid, const char* what) REQUIRES(loop_thread) {
    spdlog::warn("client {} (pid {} uid {}): {} refused: not an admin", c->id, c->pid, c->uid,
                 what);
    write_tags_reply(c->writer, rid,
                     Error{ErrorCode::invalid_argument,
                           "permission denied: uid " + std::to_string(c->uid) +
                               " may use tags but not define or remove them (daemon.admin_uids, "
                               "admin_gids)"},
                     {});
  };
  auto busy = [&](uint64_t rid) {
    // Busy, as outrund has always answered it (an outrun::Client reads it as unavailable).
    flatbuffers::FlatBufferBuilder f(256);
    c->writer.write(protocol::encode_tags_reply(f, rid, wire::Status::Busy,
                                                "too many tag definitions waiting; try again", {}));
  };
  switch (frame->body_type()) {
    case wire::Body::DefineTags: {
      const auto* d = &std::get<protocol::DefineTagsMsg>(msg);
      const uint64_t rid = d->request_id;
      if (!c->admin) {
        refuse_admin(rid, "DefineTags");
        return true;
      }
      if (!d->toml) {
        write_tags_reply(c->writer, rid,
                         Error{ErrorCode::invalid_argument, "DefineTags needs toml"}, {});
        return true;
      }
      spdlog::info("client {} (pid {}): define tags ({} bytes{})", c->id, c->pid, d->toml->size(),
                   d->replace_all ? ", replace all" : "");
      auto job = [this, c, rid, text = std::string(*d->toml), replace = d->replace_all] {
        std::vector<tags::TagDefinition> defs;
        std::string why;
        if (!tags::file::parse_tags(text, "", &defs, &why)) {
          write_tags_reply(c->writer, rid, Error{ErrorCode::invalid_argument, why}, {});
          return;
        }
        std::unordered_set<std::string> defined;
        for (const auto& def : defs) defined.insert(def.id);
        nlohmann::ordered_json removed = nlohmann::ordered_json::array();
        if (replace)
          for (const auto& id : tags_->ids())
            if (!defined.count(id)) removed.push_back(id);
        if (Error e = tags_->apply(defs, replace)) {
          write_tags_reply(c->writer, rid, e, {});
          return;
        }
        nlohmann::ordered_json ids = nlohmann::ordered_json::array();
        for (const auto& def : defs) ids.push_back(def.id);
        write_tags_reply(c->writer, rid, {},
                         dump_json(nlohmann::ordered_json{{"defined", ids}, {"removed", removed}}));
      };
      if (!post_tags_job(std::move(job))) busy(rid);
      return true;
    }
    case wire::Body::RemoveTags: {
      const auto* r = &std::get<protocol::RemoveTagsMsg>(msg);
      const uint64_t rid = r->request_id;
      if (!c->admin) {
        refuse_admin(rid, "RemoveTags");
        return true;
      }
      std::vector<std::string> ids;
      if (!detail::decode_tag_ids(r->ids, &ids, &why)) {
        write_tags_reply(c->writer, rid, Error{ErrorCode::invalid_argument, why}, {});
        return true;
      }
      auto job = [this, c, rid, ids = std::move(ids)] {
        // All or none: every id must be a virtual tag, and no tag that stays may use one.
        std::unordered_set<std::string> gone(ids.begin(), ids.end());
        const std::vector<std::string> all = tags_->ids();  // topological order
        std::unordered_set<std::string> known(all.begin(), all.end());
        for (const auto& id : ids)
          if (!known.count(id)) {
            write_tags_reply(c->writer, rid,
                             Error{ErrorCode::invalid_argument, "unknown virtual tag '" + id + "'"},
                             {});
            return;
          }
        for (const auto& id : all) {
          if (gone.count(id)) continue;
          tags::TagInfo info;
          if (tags_->info(id, &info)) continue;
          for (const auto& in : info.definition.inputs)
            if (gone.count(in.tag)) {
              write_tags_reply(c->writer, rid,
                               Error{ErrorCode::invalid_argument,
                                     "'" + in.tag + "' is an input of '" + id + "'"},
                               {});
              return;
            }
        }
        nlohmann::ordered_json removed = nlohmann::ordered_json::array();
        for (auto it = all.rbegin(); it != all.rend(); ++it) {  // dependents first
          if (!gone.count(*it)) continue;
          if (Error e = tags_->remove(*it)) {
            write_tags_reply(c->writer, rid, e, {});
            return;
          }
          removed.push_back(*it);
        }
        write_tags_reply(c->writer, rid, {},
                         dump_json(nlohmann::ordered_json{{"removed", removed}}));
      };
      if (!post_tags_job(std::move(job))) busy(rid);
      return true;
    }
    case wire::Body::ListTags: {
      const uint64_t rid = std::get<protocol::ListTagsMsg>(msg).request_id;
      std::string json = tags_list_json();
      Error e;
      if (constexpr std::size_t kMaxDocument = protocol::kMaxFrameSize - 4096;
          json.size() > kMaxDocument) {
        e = Error{ErrorCode::unavailable, "the tags document is " + std::to_string(json.size()) +
                                              " bytes, more than a reply frame holds"};
        json.clear();
      }
      write_tags_reply(c->writer, rid, e, json);
      return true;
    }
    case wire::Body::SourceUpdates: {
      const auto* u = &std::get<protocol::SourceUpdatesMsg>(msg);
      const uint64_t rid = u->request_id;
      Error e;
      std::vector<tags::SourceUpdate> updates;
      if (const auto* items = u->updates) {
        if (items->size() > detail::kMaxUpdatesPerFrame) {
          e = Error{ErrorCode::invalid_argument, "more than " +
                                                     std::to_string(detail::kMaxUpdatesPerFrame) +
                                                     " updates in one SourceUpdates"};
        } else {
          updates.reserve(items->size());
          std::size_t budget = protocol::kMaxFrameSize;
          for (const wire::TagValue* tv : *items) {
            tags::Change ch;
            if (!detail::decode_tag_entry(tv, &ch, &budget, &why)) {
              e = Error{ErrorCode::invalid_argument, why};
              break;
            }
            updates.push_back(tags::SourceUpdate{std::move(ch.tag), std::move(ch.value)});
          }
        }
      }
      if (!e && !updates.empty())
        e = u->time == 0 ? tags_->update(updates) : tags_->update(updates, DateTime{u->time});
      if (rid != 0 || e) write_tags_reply(c->writer, rid, e, {});
      return true;
    }
    case wire::Body::Subscribe: {
      const auto* sb = &std::get<protocol::SubscribeMsg>(msg);
      const uint64_t rid = sb->request_id;
      std::vector<std::string> ids;
      Error e;
      if (!detail::decode_tag_ids(sb->ids, &ids, &why)) {
        e = Error{ErrorCode::invalid_argument, why};
      } else {
        MutexLock lock(sub_mu_);
        if (sb->cancel) {
          if (ids.empty()) {
            c->sub_all = false;
            c->sub_ids.clear();
          } else {
            for (const auto& id : ids) c->sub_ids.erase(id);
          }
          if (!c->sub_all && c->sub_ids.empty()) {
            subscribers_.erase(c.get());
            c->sub_latest.clear();
            c->sub_overflow = false;
          }
        } else if (c->sub_ids.size() + ids.size() > kMaxSubscribedIds) {
          e = Error{ErrorCode::invalid_argument, "more than " + std::to_string(kMaxSubscribedIds) +
                                                     " subscribed ids on one connection"};
        } else {
          if (ids.empty())
            c->sub_all = true;
          else
            c->sub_ids.insert(ids.begin(), ids.end());
          subscribers_[c.get()] = c;
        }
      }
      write_tags_reply(c->writer, rid, e, {});
      return true;
    }
    case wire::Body::ReadTags: {
      const auto* r = &std::get<protocol::ReadTagsMsg>(msg);
      std::vector<std::string> ids;
      Error e;
      std::vector<tags::DataValue> values;
      if (!detail::decode_tag_ids(r->ids, &ids, &why)) {
        e = Error{ErrorCode::invalid_argument, why};
      } else {
        values.resize(ids.size());
        for (std::size_t i = 0; i < ids.size() && !e; ++i) e = tags_->read(ids[i], &values[i]);
      }
      auto& f = t_changes_fbb;
      f.Clear();
      std::vector<flatbuffers::Offset<wire::TagValue>> offs;
      if (!e)
        for (std::size_t i = 0; i < ids.size(); ++i)
          offs.push_back(detail::encode_tag_entry(f, ids[i], values[i]));
      auto frame_bytes = protocol::encode_tag_values(f, r->request_id, detail::wire_status(e.code),
                                                     e.message, offs);
      if (frame_bytes.size() > protocol::kMaxFrameSize) {
        f.Clear();
        frame_bytes = protocol::encode_tag_values(f, r->request_id, wire::Status::Unavailable,
                                                  "the values are more than a frame holds", {});
      }
      c->writer.write(frame_bytes);
      return true;
    }
    default:
      return false;
  }
}

}  // namespace outrun::daemon
