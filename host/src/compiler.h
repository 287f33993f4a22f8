// The host's compile-only process (design/sandbox.md "The compiler", design/decisions.md
// D-compiler): an outrun-worker started with --compile-only, confined like the shards' workers,
// that turns every registered script's source into Lua bytecode and never runs a chunk. The host
// keeps that bytecode in the script's record (ScriptRecord::compiled, within
// HostOptions::bytecode_cache_bytes), and a worker that does not hold the script yet (after a
// restart) gets the bytecode instead of the source: a load of ~2 µs instead of a compile of ~22.
//
// Loop thread only, but for enqueue(), check() and the counters: its loop-side members are
// GUARDED_BY(loop_role_) (the host's loop role); the entry points (the loop's calls, the worker's
// events, the timers) assert it. Nothing here is on an evaluation's path: a script without
// bytecode (not compiled yet, refused, over the cache) is sent with its source, as before.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "log.h"
#include "outrun/runner.h"
#include "outrun/thread_annotations.h"
#include "restart_policy.h"
#include "script_registry.h"
#include "worker_process.h"

namespace outrun::detail {

struct CompilerOptions {
  SpawnSpec spawn;                     // --compile-only 1 is added
  std::size_t cache_bytes = 0;         // what all kept bytecode may hold together
  std::chrono::milliseconds deadline;  // its hello, and per Compile frame plus kPerItemMs each
  RestartConfig restart;               // the shards' backoff and crash loop, applied to it
};

// Counters (any thread).
struct CompilerCounters {
  std::atomic<uint64_t> compiled{0};  // scripts whose bytecode is kept
  std::atomic<uint64_t> refused{0};   // its compile failed, or it did not fit: source path
  std::atomic<uint64_t> restarts{0};  // compile-only processes started after the first
  std::atomic<uint64_t> kills{0};     // killed: a deadline passed, or a frame broke the rules
};

class Compiler final : public WorkerEvents {
 public:
  static constexpr std::size_t kBatchItems = 256;
  static constexpr std::size_t kBatchBytes = 4u << 20;  // of source, per Compile frame
  static constexpr int64_t kPerItemMs = 20;

  // `wake` runs on any thread to have the loop call pump(); `freed` on the loop once the last
  // process object is gone after shutdown() (the host waits for it like for its workers).
  Compiler(uv_loop_t* loop, const ThreadRole& loop_role, const Log* log,
           const ScriptRegistry* registry, CompilerOptions opts, std::function<void()> wake,
           std::function<void()> freed);
  ~Compiler();
  Compiler(const Compiler&) = delete;
  Compiler& operator=(const Compiler&) = delete;

  // Any thread: `r` was just registered (a new record). Holds no reference to it: a record
  // freed before its turn is skipped, and one freed while it compiles gets nothing.
  void enqueue(const ScriptRecord& r) EXCLUDES(mu_);
  // Any thread: compiles `source` as chunk `chunk_name` in the compile-only process, keeps
  // nothing, and calls `done` on the loop thread (never inside this call) with its verdict:
  // none, or compile_error with Lua's message ("name:LINE: ..."); `unavailable` when it cannot
  // tell (the process is in its crash loop, failed on this source twice, or shuts down). A
  // MemoryLimit answer (the compile-only process's own limits) is no verdict: none.
  // (register_script with RegisterOptions::check, design/decisions.md D-register-check.)
  using CheckDone = std::function<void(Error)>;
  void check(std::string source, std::string chunk_name, CheckDone done) EXCLUDES(mu_);

  // Loop thread (each asserts it).
  // Spawns the process (start-up does not wait for its hello); on failure the restart timer
  // tries again.
  void start_first() {
    loop_role_.assert_here();
    start_or_retry();
  }
  void pump();          // takes what enqueue() queued; sends the next Compile frame if none is out
  void shutdown();      // Shutdown to the process, its handles closed when it exits
  bool alive() const {  // a process object not yet freed
    loop_role_.assert_here();
    return live_ > 0;
  }
  // Any thread: nothing queued or in flight; the current process (0: none).
  bool idle() const { return idle_pub_.load(std::memory_order_acquire); }
  int pid() const { return pid_pub_.load(std::memory_order_relaxed); }
  const CompilerCounters& counters() const { return counters_; }
  std::size_t cached_bytes() const;  // any thread

  // WorkerEvents
  void on_worker_created(WorkerProcess* w) override;
  void on_worker_exit(WorkerProcess* w) override;
  void on_worker_readable(WorkerProcess* w) override;
  void on_worker_writable(WorkerProcess* w) override;
  void on_worker_stream_error(WorkerProcess* w) override;
  void on_worker_linger_expired(WorkerProcess* w) override;
  void on_worker_freed(WorkerProcess* w) override;

 private:
  Error start() REQUIRES(loop_role_);
  void send_next() REQUIRES(loop_role_);
  void publish() REQUIRES(loop_role_);         // idle_pub_, pid_pub_
  void start_or_retry() REQUIRES(loop_role_);  // start(), or the restart timer when it fails
  // Applies the policy's decision (detail::apply_restart): the crash loop, then the timer once.
  void schedule_restart(const RestartDecision& d) REQUIRES(loop_role_);
  void handle_frames() REQUIRES(loop_role_);
  // The current process failed (`why`; `cause` is its Death's): killed, its frame's
  // sources retried one per frame (a source in two failed frames is given up), the next process
  // started when the policy says.
  void fail(const std::string& why, DeathCause cause) REQUIRES(loop_role_);
  bool accept(const wire::Compiled* c, std::string* why) REQUIRES(loop_role_);
  static void on_deadline(uv_timer_t* t);
  static void on_restart(uv_timer_t* t);

  // A source to check only (check()): compiled like a record's, nothing kept.
  struct Check {
    std::string source, chunk_name;
    CheckDone done;
  };
  // A record to compile, by name; in flight with copies of what the Compile frame needs.
  struct Pending {
    uint32_t id = 0;
    uint64_t serial = 0;
    bool retry = false;  // it was in a frame whose process failed: a second failure gives it up
    std::shared_ptr<Check> check;  // set: a check, not a record
  };
  struct InFlight {
    Pending name;
    std::string source, chunk_name;
  };
  void take(const Pending& p, std::size_t* bytes) REQUIRES(loop_role_);
  // Checks answered: their `done` runs once the compiler's state is consistent (run_verdicts).
  void verdict(const Pending& p, Error e) REQUIRES(loop_role_) {
    verdicts_.emplace_back(p.check, std::move(e));
  }
  void run_verdicts() REQUIRES(loop_role_);
  // Every check waiting: `unavailable`.
  void answer_queued_checks(const std::string& why) REQUIRES(loop_role_);

  uv_loop_t* loop_;
  const ThreadRole& loop_role_;  // the host's loop thread
  const Log* log_;
  const ScriptRegistry* registry_;
  const CompilerOptions opts_;
  const std::function<void()> wake_;
  const std::function<void()> freed_;

  Mutex mu_;
  std::vector<Pending> incoming_ GUARDED_BY(mu_);

  // Loop thread. (The timers are initialised by the constructor, before the loop thread runs.)
  std::deque<Pending> queue_ GUARDED_BY(loop_role_);  // to compile, in order; singles_ first
  // Of a frame whose process failed: retried one at a time.
  std::vector<Pending> singles_ GUARDED_BY(loop_role_);
  std::vector<InFlight> in_flight_ GUARDED_BY(loop_role_);  // the Compile frame out now
  // Where the compiler is in its life (one value for what were four booleans):
  //   kNew ──start──► kStarting ──hello──► kReady ──fail──► kDown ──restart timer──► kStarting
  //   a decision of the crash loop (fail, or a failed start) ──► kCrashLoop ──hello──► kReady
  //   any ──shutdown──► kStopped (for good)
  enum class Phase : uint8_t {
    kNew,        // not started yet (start_first)
    kStarting,   // a process is spawned; its hello has not arrived
    kReady,      // its hello arrived: Compile frames go to it
    kDown,       // no process: the restart timer starts the next
    kCrashLoop,  // the policy put it in its crash loop, and no process said hello since (one
                 // may be starting after the cool-down): checks are answered at once
    kStopped,    // shutdown(): nothing starts again
  };
  Phase phase_ GUARDED_BY(loop_role_) = Phase::kNew;
  // The current process (kStarting, kReady, or kCrashLoop).
  WorkerProcess* process_ GUARDED_BY(loop_role_) = nullptr;
  int live_ GUARDED_BY(loop_role_) = 0;
  uint64_t starts_ GUARDED_BY(loop_role_) = 0;  // processes started (the first is no restart)
  RestartPolicy policy_ GUARDED_BY(loop_role_);
  std::vector<std::pair<std::shared_ptr<Check>, Error>> verdicts_ GUARDED_BY(loop_role_);
  uv_timer_t deadline_ GUARDED_BY(loop_role_){};
  uv_timer_t restart_ GUARDED_BY(loop_role_){};
  std::shared_ptr<std::atomic<int64_t>> account_;  // bytes of all kept bytecode
  CompilerCounters counters_;
  std::atomic<bool> idle_pub_{true};
  std::atomic<int> pid_pub_{0};
};

}  // namespace outrun::detail
