// WorkerProcess: spawning a worker, its handles, its stderr, and freeing it (loop thread).
#include "worker_process.h"

#include <boost/interprocess/mapped_region.hpp>

#include "clock.h"

namespace outrun::detail {

namespace {

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
  platform::release_worker(&child_);  // Windows: its process and job handles
}

void WorkerProcess::init_handle(uv_handle_t* h) {
  h->data = this;
  ++open_handles_;
}

void WorkerProcess::close_handle(uv_handle_t* h) {
  if (!uv_is_closing(h)) uv_close(h, &WorkerProcess::on_closed);
}

void WorkerProcess::on_closed(uv_handle_t* h) {
  auto* w = static_cast<WorkerProcess*>(h->data);
  if (h == w->wwatch_.handle())
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
  platform::WorkerChannels ch;
  // Until the process runs, a failure leaves nothing behind: no page name, no fd, no object.
  ScopeGuard cleanup([&] {
    platform::close_all(&ch);
    w->page_host_.forget_name();
    delete w;
  });

  // The status page first: the worker maps it before it says hello.
  if (std::string err = w->page_host_.create(spec.shard); !err.empty())
    return {ErrorCode::unavailable, "cannot create a status page: " + err};
  w->page_ = new (w->page_host_.region()->get_address()) protocol::StatusPage();
  w->page_->version.store(protocol::kStatusPageVersion);
  w->page_->magic.store(protocol::kStatusPageMagic, std::memory_order_release);

  // Frames to the worker go through one channel, results back through another.
  if (std::string err = platform::open_worker_channels(&ch); !err.empty())
    return {ErrorCode::unavailable, err};

  platform::SpawnRequest request;
  request.path = spec.path;
  request.args = platform::worker_channel_args(ch, w->page_host_.name());
  request.args.insert(request.args.end(), spec.args.begin(), spec.args.end());
  request.env = spec.env;  // null: the host's own environment
  request.channels = &ch;
  const std::string err = platform::spawn_worker(loop, &w->process_, &w->err_pipe_,
                                                 &WorkerProcess::on_exit, request, &w->child_);
  platform::close_worker_ends(&ch);
  w->started_at_ = Clock::now();
  w->started_ns_ = monotonic_ns();
  events->on_worker_created(w);
  // Both handles are initialised now, even on failure: from here they close the object.
  w->init_handle(platform::as_uv_handle(&w->process_));
  w->init_handle(reinterpret_cast<uv_handle_t*>(&w->err_pipe_));
  if (!err.empty()) {
    platform::close_all(&ch);
    w->page_host_.forget_name();
    cleanup.dismiss();
    w->life_ = Life::kDead;
    w->exit_ = ExitStatus{};
    w->close_process();
    w->close_handle(reinterpret_cast<uv_handle_t*>(&w->err_pipe_));
    return {ErrorCode::unavailable, "cannot start worker '" + spec.path + "': " + err};
  }
  cleanup.dismiss();
  uv_read_start(reinterpret_cast<uv_stream_t*>(&w->err_pipe_), &WorkerProcess::on_err_alloc,
                &WorkerProcess::on_err_read);
  uv_timer_init(loop, &w->linger_);
  w->init_handle(reinterpret_cast<uv_handle_t*>(&w->linger_));
  w->results_.open(loop, ch.host_read, &w->reader_, &WorkerProcess::on_readable);
  w->init_handle(w->results_.handle());
  w->results_.start();
  const platform::Channel wfd = ch.host_write;
  w->wwatch_.open(loop, wfd, &WorkerProcess::on_writable);
  w->init_handle(w->wwatch_.handle());
  w->io_open_ = true;
  w->writer_ = std::shared_ptr<protocol::FrameWriter>(
      new protocol::FrameWriter(wfd, std::move(frame_writer_blocked)),
      [wfd](protocol::FrameWriter* p) {
        delete p;
        platform::Channel c = wfd;
        platform::close_channel(&c);  // only when no producer can still be writing to it
      });
  *out = w;
  return {};
}

void WorkerProcess::greet() {
  greeted_ = true;
  if (life_ == Life::kStarting) life_ = Life::kServing;
  // The worker has mapped its page: the name is no longer needed.
  page_host_.forget_name();
}

void WorkerProcess::end_stream(uint64_t linger_ms) {
  if (life_ == Life::kDead || life_ == Life::kStreamEnded) return;
  life_ = Life::kStreamEnded;
  results_.stop();
  wwatch_.stop();
  uv_timer_start(&linger_, &WorkerProcess::on_linger, linger_ms, 0);
}

void WorkerProcess::pause_reading() {
  if (io_open_ && (life_ == Life::kStarting || life_ == Life::kServing)) results_.stop();
}

void WorkerProcess::resume_reading() {
  if (io_open_ && (life_ == Life::kStarting || life_ == Life::kServing)) results_.start();
}

void WorkerProcess::watch_writable() {
  if (watching_write_ || life_ == Life::kDead || life_ == Life::kStreamEnded || !io_open_) return;
  watching_write_ = true;
  wwatch_.start();
}

void WorkerProcess::unwatch_writable() {
  if (!watching_write_ || life_ == Life::kDead || life_ == Life::kStreamEnded) return;
  watching_write_ = false;
  wwatch_.stop();
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
  if (!exit_) platform::kill_worker(child_);  // not yet reaped, so the group id is still ours
  // Never mapped by a worker that did not say hello: the name would stay in /dev/shm.
  if (!greeted_) page_host_.forget_name();
}

void WorkerProcess::close_io() {
  if (!io_open_) return;
  io_open_ = false;
  results_.stop();
  wwatch_.stop();
  close_handle(results_.handle());
  close_handle(wwatch_.handle());
  close_handle(reinterpret_cast<uv_handle_t*>(&linger_));
}

void WorkerProcess::close_process() {
  uv_handle_t* h = platform::as_uv_handle(&process_);
  if (!uv_is_closing(h)) platform::close_process_handle(&process_, &WorkerProcess::on_closed);
}

void WorkerProcess::on_exit(platform::ProcessHandle* p, int64_t status, int term_signal) {
  auto* w = static_cast<WorkerProcess*>(platform::as_uv_handle(p)->data);
  w->exit_ = ExitStatus{status, term_signal};  // reaped: never signal its pid again
  w->events_->on_worker_exit(w);
  w->close_process();
}

void WorkerProcess::on_readable(platform::ResultStream* s, int status) {
  auto* w = static_cast<WorkerProcess*>(s->handle()->data);
  if (w->dead()) return;
  if (status < 0) {  // EPOLLERR (e.g. ECONNRESET)
    w->events_->on_worker_stream_error(w);
    return;
  }
  w->events_->on_worker_readable(w);
}

void WorkerProcess::on_writable(platform::WriteWatch* ww, int status) {
  auto* w = static_cast<WorkerProcess*>(ww->handle()->data);
  if (w->dead()) return;
  if (status < 0) {  // the worker's end is gone
    w->events_->on_worker_stream_error(w);
    return;
  }
  w->events_->on_worker_writable(w);
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
            shard_index_, child_.pid, kMaxWorkerLogBytes);
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
