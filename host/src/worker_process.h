// One worker process and everything the host holds for it: its libuv handles (process, result
// poll, write poll, linger timer, stderr pipe), its sockets, its status page, its frame reader
// and writer. Loop thread only, but for what a leader reads while it holds its shard's read token
// (ReadToken::token; the WorkerProcess* is the token's source, not Shard::worker): reader(),
// read_results() and greeted() (which the loop writes only while it holds the token). It closes its
// own handles and frees itself when the last one has closed (design/architecture.md
// "WorkerProcess").
#pragma once

#include <uv.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "log.h"
#include "outrun/platform/worker_os.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/frame_writer.h"
#include "outrun/protocol/status_page.h"
#include "outrun/status.h"
#include "restart_policy.h"

namespace boost::interprocess {
class mapped_region;
}

namespace outrun::detail {

struct Shard;
class WorkerProcess;

// What a worker's handles report, to the host (Host::Impl). Loop thread.
class WorkerEvents {
 public:
  virtual void on_worker_created(WorkerProcess* w) = 0;       // on_worker_freed follows, some day
  virtual void on_worker_exit(WorkerProcess* w) = 0;          // reaped: w->exit_status() is set
  virtual void on_worker_readable(WorkerProcess* w) = 0;      // results to read
  virtual void on_worker_writable(WorkerProcess* w) = 0;      // room for a handed-off write
  virtual void on_worker_stream_error(WorkerProcess* w) = 0;  // EPOLLERR on either socket
  virtual void on_worker_linger_expired(WorkerProcess* w) = 0;
  virtual void on_worker_freed(WorkerProcess* w) = 0;  // every handle closed; w is being deleted

 protected:
  ~WorkerEvents() = default;
};

struct SpawnSpec {
  std::string path;               // the worker executable
  std::vector<std::string> args;  // after argv[0]; platform::worker_channel_args() are added
  char** env = nullptr;           // null: the host's own environment
  int shard = 0;
};

class WorkerProcess {
 public:
  // Where it is in its life. Moves only forward; a step may be skipped (a worker that crashes
  // at start goes from kStarting to kDead).
  enum class Life : uint8_t {
    kStarting,     // spawned; no hello yet
    kServing,      // said hello: evaluations are answered
    kStreamEnded,  // its stream ended (EOF, a failed send): reading stopped, exit status awaited
    kDead,         // its death was handled: group killed, evaluations ended or retried
  };
  using ExitStatus = detail::ExitStatus;

  // Starts a worker for `shard` through the platform seam (outrun/platform/worker_os.h): status
  // page, two channels, the process in its own process group, its handles. On failure nothing is
  // left behind (one error path) and the error says what failed. `frame_writer_blocked` runs on
  // producer threads when a write must be finished by the loop.
  static Error spawn(uv_loop_t* loop, Shard* shard, WorkerEvents* events, const Log* log,
                     const SpawnSpec& spec, std::function<void()> frame_writer_blocked,
                     WorkerProcess** out);

  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  Shard& shard() const { return *shard_; }
  int pid() const { return child_.pid; }
  Life life() const { return life_; }
  bool dead() const { return life_ == Life::kDead; }
  bool greeted() const { return greeted_; }
  // Reaped by libuv: its pid may be reused, never signal it again.
  const std::optional<ExitStatus>& exit_status() const { return exit_; }
  Clock::time_point started_at() const { return started_at_; }
  int64_t started_ns() const { return started_ns_; }
  protocol::StatusPage* page() const { return page_; }
  const std::shared_ptr<boost::interprocess::mapped_region>& page_region() const {
    return page_host_.region();
  }
  const std::shared_ptr<protocol::FrameWriter>& writer() const { return writer_; }
  protocol::FrameReader& reader() { return reader_; }
  // Reads what the worker sent into reader() (FrameReader::read_from's contract: > 0, 0 at the
  // end of its stream, -EAGAIN nothing now, < 0 an error). Never blocks.
  long read_results() { return results_.read(); }
  platform::Channel result_channel() const { return results_.channel(); }  // a leader polls it

  // The hello arrived: the page is mapped, its name is removed.
  void greet();
  // End of stream: stop reading and writing, wait kLingerMs for the exit status.
  void end_stream(uint64_t linger_ms);
  // A leader reads the result socket (leader/follower): stop polling it, and poll it again.
  void pause_reading();
  void resume_reading();
  // A write was handed to the loop: watch the socket until it has room (idempotent).
  void watch_writable();
  void unwatch_writable();
  // restart_shard: the worker was sent Shutdown; it must exit within `ms` or is killed.
  void request_restart(uint64_t ms);
  bool restart_requested() const { return restart_requested_; }

  // The host's decision to kill, recorded before it does: it names the cause of the death.
  void decide_kill(DeathCause cause, uint64_t overrun_id = 0) {
    if (!kill_cause_) kill_cause_ = cause;
    overrun_id_ = overrun_id;
  }
  const std::optional<DeathCause>& kill_cause() const { return kill_cause_; }
  uint64_t overrun_id() const { return overrun_id_; }

  // Its Death record, built once when its death is handled, before mark_dead: the cause is the
  // host's decision to kill if there was one, else `noticed`; with its exit status, its uptime
  // at `now`, and the evaluation its status page names as running (make_death, restart_policy.h).
  Death death(DeathCause noticed, std::string how, Clock::time_point now) const;
  // Its death is being handled: platform::kill_worker (unless reaped), Life::kDead.
  void mark_dead();
  // Closes the socket handles and the linger timer (the process and stderr handles close at
  // exit and at EOF). Idempotent.
  void close_io();

 private:
  WorkerProcess(Shard* shard, WorkerEvents* events, const Log* log);
  ~WorkerProcess();

  void init_handle(uv_handle_t* h);
  void close_handle(uv_handle_t* h);
  void close_process();
  static void on_closed(uv_handle_t* h);
  static void on_exit(platform::ProcessHandle* p, int64_t status, int term_signal);
  static void on_readable(platform::ResultStream* s, int status);
  static void on_writable(platform::WriteWatch* w, int status);
  static void on_linger(uv_timer_t* t);
  static void on_err_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
  static void on_err_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  void log_line(std::string_view line);

  Shard* shard_;
  WorkerEvents* events_;
  const Log* log_;
  int shard_index_ = 0;
  Life life_ = Life::kStarting;
  bool greeted_ = false;
  bool restart_requested_ = false;
  bool io_open_ = false;  // poll, wpoll, linger initialised and not yet closed
  bool watching_write_ = false;
  std::optional<ExitStatus> exit_;
  std::optional<DeathCause> kill_cause_;
  uint64_t overrun_id_ = 0;
  int open_handles_ = 0;

  platform::ProcessHandle process_{};
  platform::ResultStream results_;  // the results channel, read on the loop
  platform::WriteWatch wwatch_;     // room on the frames channel, only while a frame waits
  uv_timer_t linger_{};   // after end-of-stream, or restart_shard: how long until it is killed
  uv_pipe_t err_pipe_{};  // the worker's stderr, logged by the host; closes at its EOF
  std::string err_line_;  // a partial line of it
  std::size_t err_logged_ = 0;  // bytes of it logged so far (bounded)

  platform::WorkerChild child_;
  // One channel per direction: a worker blocked reading frames is never woken by the host
  // draining its results (one shared socket has one wait queue for both directions). results_
  // owns the one results are read from; the writer owns the other one.
  Clock::time_point started_at_{};
  int64_t started_ns_ = 0;  // CLOCK_MONOTONIC, for heartbeat age before the first beat
  std::shared_ptr<protocol::FrameWriter> writer_;  // also referenced by producers
  protocol::FrameReader reader_;
  platform::HostStatusPage page_host_;  // its mapping; its name until the worker has mapped it
  protocol::StatusPage* page_ = nullptr;
};

inline constexpr std::size_t kMaxWorkerLogBytes = 64u << 10;  // per worker process
// After its stream ended, how long a worker (or the compile-only process) has to exit before it
// is killed.
inline constexpr uint64_t kLingerMs = 1000;

const char* to_string(WorkerProcess::Life l);

// Applies a restart decision (RestartPolicy::on_death, on_start_failure), the one way a shard or
// the compile-only process does: a crash loop is entered first (`enter_crash_loop(reason)`), then
// `timer` is armed, once, for the decision's delay (the next start, or the cool-down).
void apply_restart(uv_timer_t* timer, uv_timer_cb on_restart, const RestartDecision& decision,
                   const std::function<void(const std::string& reason)>& enter_crash_loop);

}  // namespace outrun::detail
