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

Server::~Server() = default;

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
    if (!Acceptor::check_fd_limit(cfg_, &why)) {
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
  if (cfg_.host.callbacks_on_loop)
    cfg_.host.after_loop_callbacks = [this] {
      // Before start_serving (the tags file's evaluations at start) the role is still this
      // thread's: nothing is corked then (only a client's results are, and none is connected).
      if (!loop_thread.here()) return;
      loop_thread.assert_here();
      corked_run_ended();
    };
  if (Error e = Host::create(cfg_.host, &host_)) {
    spdlog::critical("cannot start the workers: {}", e.message);
    return 3;
  }
  counters_.shards = host_->shards();
  counters_.shard_latency = std::make_unique<LatencyHistogram[]>(counters_.shards);
  init_scheduler();
  auto stop_tags = [this] { tags_.stop(); };
  if (const int rc = tags_.start(*host_, [this](Request rq, Callback done) {
        submit_tag_evaluation(std::move(rq), std::move(done));
      })) {
    stop_tags();
    destroy_host();
    return rc;
  }
  std::string err;
  if (!acceptor_.open(&err)) {
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
  acceptor_.start(loop_);
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
    s->tags_.note_sighup();
    // The reload waits for running waves and compiles in the workers: not on the loop.
    // Ahead of every queued definition, never refused (design/daemon.md "Tags").
    if (!s->cfg_.tags_file.empty()) s->tags_.request_reload();
    return;
  }
  s->begin_drain();
}

void Server::begin_drain() {
  if (!life_.advance(Lifecycle::State::kDraining)) return;  // draining or finished already
  spdlog::info("stopping: no new connections; draining {} evaluations in flight (up to {} ms)",
               counters_.inflight.load(), cfg_.drain_timeout.count());
  sd_notify("STOPPING=1");
  acceptor_.stop();                            // no new connections; the socket file goes
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
  const bool idle =
      s->counters_.inflight.load() == 0 && !pending_writes && s->tags_.reads_waiting() == 0;
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
  acceptor_.close();
  if (timers_) {
    timers_ = false;
    uv_timer_stop(&hello_timer_);
    uv_close(reinterpret_cast<uv_handle_t*>(&hello_timer_), nullptr);
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

}  // namespace outrun::daemon
