// WorkerProcess: spawning a worker, its handles, its stderr, and freeing it (loop thread).
#include "worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstring>
#include <random>

#include "clock.h"

namespace outrun::detail {

namespace bip = boost::interprocess;

namespace {

// A per-process unique name; /dev/shm entries are removed as soon as the worker has mapped it.
std::string page_name(int shard) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return "/outrun-" + std::to_string(getpid()) + "-" + std::to_string(shard) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + std::to_string(rng() & 0xffffff);
}

// Runs `f` when the scope ends unless dismissed: the one cleanup of a failed spawn.
template <class F>
class ScopeGuard {
 public:
  explicit ScopeGuard(F f) : f_(std::move(f)) {}
  ~ScopeGuard() {
    if (armed_) f_();
  }
  void dismiss() { armed_ = false; }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  F f_;
  bool armed_ = true;
};

}  // namespace

WorkerProcess::WorkerProcess(Shard* shard, WorkerEvents* events, const Log* log)
    : shard_(shard), events_(events), log_(log) {}

WorkerProcess::~WorkerProcess() {
  if (fd_ >= 0) close(fd_);
}

template <class H>
void WorkerProcess::init_handle(H* h) {
  h->data = this;
  ++open_handles_;
}

void WorkerProcess::close_handle(uv_handle_t* h) {
  if (!uv_is_closing(h)) uv_close(h, &WorkerProcess::on_closed);
}

void WorkerProcess::on_closed(uv_handle_t* h) {
  auto* w = static_cast<WorkerProcess*>(h->data);
  if (h == reinterpret_cast<uv_handle_t*>(&w->wpoll_))
    w->writer_.reset();  // its socket closes with the last reference (producers may hold one)
  if (--w->open_handles_ == 0) {
    w->events_->on_worker_freed(w);
    delete w;
  }
}

Error WorkerProcess::spawn(uv_loop_t* loop, Shard* shard, WorkerEvents* events, const Log* log,
                           const SpawnSpec& spec, std::function<void()> frame_writer_blocked,
                           WorkerProcess** out) {
  auto* w = new WorkerProcess(shard, events, log);
  w->shard_index_ = spec.shard;
  int to_worker[2] = {-1, -1}, from_worker[2] = {-1, -1};
  // Until the process runs, a failure leaves nothing behind: no page name, no fd, no object.
  ScopeGuard cleanup([&] {
    for (int fd : {to_worker[0], to_worker[1], from_worker[0], from_worker[1]})
      if (fd >= 0) close(fd);
    w->fd_ = -1;
    if (!w->page_name_.empty()) bip::shared_memory_object::remove(w->page_name_.c_str());
    delete w;
  });

  // The status page first: the worker maps it before it says hello.
  w->page_name_ = page_name(spec.shard);
  try {
    bip::shared_memory_object shm(bip::create_only, w->page_name_.c_str(), bip::read_write,
                                  bip::permissions(0600));
    shm.truncate(protocol::kStatusPageSize);
    w->page_region_ =
        std::make_shared<bip::mapped_region>(shm, bip::read_write, 0, protocol::kStatusPageSize);
  } catch (const std::exception& e) {
    return {ErrorCode::unavailable, std::string("cannot create a status page: ") + e.what()};
  }
  w->page_ = new (w->page_region_->get_address()) protocol::StatusPage();
  w->page_->version.store(protocol::kStatusPageVersion);
  w->page_->magic.store(protocol::kStatusPageMagic, std::memory_order_release);

  // Frames to the worker go through one socketpair, results back through another.
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, to_worker) != 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, from_worker) != 0)
    return {ErrorCode::unavailable, std::string("socketpair failed: ") + strerror(errno)};
  fcntl(to_worker[0], F_SETFL, fcntl(to_worker[0], F_GETFL) | O_NONBLOCK);
  fcntl(from_worker[0], F_SETFL, fcntl(from_worker[0], F_GETFL) | O_NONBLOCK);

  std::vector<const char*> args = {
      spec.path.c_str(), "--fd", "3", "--out-fd", "4", "--status-page", w->page_name_.c_str()};
  for (const std::string& a : spec.args) args.push_back(a.c_str());
  args.push_back(nullptr);
  // The worker's stderr is a pipe the host reads and logs (bounded), never a file it could grow.
  uv_pipe_init(loop, &w->err_pipe_, 0);
  uv_stdio_container_t stdio[5];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_IGNORE;
  stdio[2].flags = static_cast<uv_stdio_flags>(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
  stdio[2].data.stream = reinterpret_cast<uv_stream_t*>(&w->err_pipe_);
  stdio[3].flags = UV_INHERIT_FD;
  stdio[3].data.fd = to_worker[1];
  stdio[4].flags = UV_INHERIT_FD;
  stdio[4].data.fd = from_worker[1];
  uv_process_options_t o{};
  o.file = spec.path.c_str();
  o.args = const_cast<char**>(args.data());
  o.exit_cb = &WorkerProcess::on_exit;
  o.flags = UV_PROCESS_DETACHED;  // setsid(): its own session and process group
  o.stdio_count = 5;
  o.stdio = stdio;
  o.env = spec.env;  // null: the host's own environment
  const int rc = uv_spawn(loop, &w->process_, &o);
  close(to_worker[1]);
  close(from_worker[1]);
  to_worker[1] = from_worker[1] = -1;
  w->started_at_ = Clock::now();
  w->started_ns_ = monotonic_ns();
  events->on_worker_created(w);
  // Both handles are initialised now, even on failure: from here they close the object.
  w->init_handle(&w->process_);
  w->init_handle(&w->err_pipe_);
  if (rc != 0) {
    close(to_worker[0]);
    close(from_worker[0]);
    bip::shared_memory_object::remove(w->page_name_.c_str());
    cleanup.dismiss();
    w->life_ = Life::kDead;
    w->exit_ = ExitStatus{};
    w->close_handle(reinterpret_cast<uv_handle_t*>(&w->process_));
    w->close_handle(reinterpret_cast<uv_handle_t*>(&w->err_pipe_));
    return {ErrorCode::unavailable, "cannot start worker '" + spec.path + "': " + uv_strerror(rc)};
  }
  cleanup.dismiss();
  w->pid_ = w->process_.pid;
  w->fd_ = from_worker[0];
  uv_read_start(reinterpret_cast<uv_stream_t*>(&w->err_pipe_), &WorkerProcess::on_err_alloc,
                &WorkerProcess::on_err_read);
  uv_timer_init(loop, &w->linger_);
  w->init_handle(&w->linger_);
  uv_poll_init(loop, &w->poll_, w->fd_);
  w->init_handle(&w->poll_);
  uv_poll_start(&w->poll_, UV_READABLE, &WorkerProcess::on_poll);
  const int wfd = to_worker[0];
  uv_poll_init(loop, &w->wpoll_, wfd);
  w->init_handle(&w->wpoll_);
  w->io_open_ = true;
  w->writer_ = std::shared_ptr<protocol::FrameWriter>(
      new protocol::FrameWriter(wfd, std::move(frame_writer_blocked)),
      [wfd](protocol::FrameWriter* p) {
        delete p;
        close(wfd);  // only when no producer can still be writing to it
      });
  *out = w;
  return {};
}

void WorkerProcess::greet() {
  greeted_ = true;
  if (life_ == Life::kStarting) life_ = Life::kServing;
  // The worker has mapped its page: the name is no longer needed.
  bip::shared_memory_object::remove(page_name_.c_str());
}

void WorkerProcess::end_stream(uint64_t linger_ms) {
  if (life_ == Life::kDead || life_ == Life::kStreamEnded) return;
  life_ = Life::kStreamEnded;
  uv_poll_stop(&poll_);
  uv_poll_stop(&wpoll_);
  uv_timer_start(&linger_, &WorkerProcess::on_linger, linger_ms, 0);
}

void WorkerProcess::pause_reading() {
  if (io_open_ && (life_ == Life::kStarting || life_ == Life::kServing)) uv_poll_stop(&poll_);
}

void WorkerProcess::resume_reading() {
  if (io_open_ && (life_ == Life::kStarting || life_ == Life::kServing))
    uv_poll_start(&poll_, UV_READABLE, &WorkerProcess::on_poll);
}

void WorkerProcess::watch_writable() {
  if (watching_write_ || life_ == Life::kDead || life_ == Life::kStreamEnded || !io_open_) return;
  watching_write_ = true;
  uv_poll_start(&wpoll_, UV_WRITABLE, &WorkerProcess::on_wpoll);
}

void WorkerProcess::unwatch_writable() {
  if (!watching_write_ || life_ == Life::kDead || life_ == Life::kStreamEnded) return;
  watching_write_ = false;
  uv_poll_stop(&wpoll_);
}

void WorkerProcess::request_restart(uint64_t ms) {
  restart_requested_ = true;
  if (io_open_) uv_timer_start(&linger_, &WorkerProcess::on_linger, ms, 0);
}

Death WorkerProcess::death(DeathCause noticed, std::string how, Clock::time_point now) const {
  Death d = make_death(noticed, kill_cause_, exit_, now - started_at_, restart_requested_,
                       std::move(how));
  int64_t since = 0;
  if (page_) protocol::read_running(*page_, &d.running, &since);  // a crash's suspect
  d.overrun_id = overrun_id_;
  return d;
}

void WorkerProcess::mark_dead() {
  life_ = Life::kDead;
  if (!exit_) kill(-pid_, SIGKILL);  // not yet reaped, so the group id is still ours
  // Never mapped by a worker that did not say hello: the name would stay in /dev/shm.
  if (!greeted_) bip::shared_memory_object::remove(page_name_.c_str());
}

void WorkerProcess::close_io() {
  if (!io_open_) return;
  io_open_ = false;
  uv_poll_stop(&poll_);
  uv_poll_stop(&wpoll_);
  close_handle(reinterpret_cast<uv_handle_t*>(&poll_));
  close_handle(reinterpret_cast<uv_handle_t*>(&wpoll_));
  close_handle(reinterpret_cast<uv_handle_t*>(&linger_));
}

void WorkerProcess::on_exit(uv_process_t* p, int64_t status, int term_signal) {
  auto* w = static_cast<WorkerProcess*>(p->data);
  w->exit_ = ExitStatus{status, term_signal};  // reaped: never signal its pid again
  w->events_->on_worker_exit(w);
  w->close_handle(reinterpret_cast<uv_handle_t*>(p));
}

void WorkerProcess::on_poll(uv_poll_t* h, int status, int events) {
  auto* w = static_cast<WorkerProcess*>(h->data);
  if (w->dead()) return;
  if (status < 0) {  // libuv reports EPOLLERR (e.g. ECONNRESET) as UV_EBADF
    w->events_->on_worker_stream_error(w);
    return;
  }
  if (events & UV_READABLE) w->events_->on_worker_readable(w);
}

void WorkerProcess::on_wpoll(uv_poll_t* h, int status, int events) {
  auto* w = static_cast<WorkerProcess*>(h->data);
  if (w->dead()) return;
  if (status < 0) {  // the worker's end is gone
    w->events_->on_worker_stream_error(w);
    return;
  }
  if (events & UV_WRITABLE) w->events_->on_worker_writable(w);
}

void WorkerProcess::on_linger(uv_timer_t* t) {
  auto* w = static_cast<WorkerProcess*>(t->data);
  w->events_->on_worker_linger_expired(w);
}

// A worker's stderr: its log lines, forwarded to the host's log with the shard's name. Bounded
// per worker process, so a worker that floods its stderr cannot flood the host's log.
void WorkerProcess::on_err_alloc(uv_handle_t*, size_t, uv_buf_t* buf) {
  static thread_local char storage[4096];  // loop thread only; consumed before the next alloc
  *buf = uv_buf_init(storage, sizeof storage);
}

void WorkerProcess::log_line(std::string_view line) {
  if (line.empty() || err_logged_ >= kMaxWorkerLogBytes) return;
  (*log_)(LogLevel::warn, "outrun: shard {} | {}", shard_index_, line.substr(0, 1000));
  err_logged_ += line.size();
  if (err_logged_ >= kMaxWorkerLogBytes)
    (*log_)(LogLevel::warn, "outrun: shard {} worker {} logged over {} bytes; the rest is dropped",
            shard_index_, pid_, kMaxWorkerLogBytes);
}

void WorkerProcess::on_err_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  auto* w = static_cast<WorkerProcess*>(s->data);
  if (nread > 0) {
    w->err_line_.append(buf->base, static_cast<std::size_t>(nread));
    std::size_t start = 0;
    for (std::size_t nl; (nl = w->err_line_.find('\n', start)) != std::string::npos; start = nl + 1)
      w->log_line(std::string_view(w->err_line_).substr(start, nl - start));
    w->err_line_.erase(0, start);
    if (w->err_line_.size() > 4096) {  // no newline in sight: log what there is
      w->log_line(w->err_line_);
      w->err_line_.clear();
    }
  } else if (nread < 0) {  // EOF (the process is gone) or an error: either way, done
    w->log_line(w->err_line_);
    w->err_line_.clear();
    uv_read_stop(s);
    w->close_handle(reinterpret_cast<uv_handle_t*>(s));
  }
}

const char* to_string(WorkerProcess::Life l) {
  switch (l) {
    case WorkerProcess::Life::kStarting:
      return "starting";
    case WorkerProcess::Life::kServing:
      return "serving";
    case WorkerProcess::Life::kStreamEnded:
      return "stream_ended";
    case WorkerProcess::Life::kDead:
      return "dead";
  }
  return "unknown";
}

void apply_restart(uv_timer_t* timer, uv_timer_cb on_restart, const RestartDecision& decision,
                   const std::function<void(const std::string& reason)>& enter_crash_loop) {
  if (decision.kind == RestartDecision::Kind::kCrashLoop) enter_crash_loop(decision.reason);
  uv_timer_start(timer, on_restart, static_cast<uint64_t>(decision.delay.count()), 0);
}

}  // namespace outrun::detail
