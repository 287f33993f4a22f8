// outrund: one outrun::Host served on a Unix domain socket. Design: design/daemon.md.
#pragma once

#include <uv.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "config.h"
#include "crash_budget.h"
#include "latency_histogram.h"
#include "lifecycle.h"
#include "log_rate_limit.h"
#include "log_ring.h"
#include "outrun/host.h"
#include "outrun/protocol/outrun_generated.h"
#include "outrun/tags.h"
#include "outrun/thread_annotations.h"
#include "registry_quota.h"
#include "scheduler.h"
#include "script_table.h"
#include "state_store.h"

// outrund's version (the build's project version; 0.0.0 in a program that compiles these
// sources without it, such as the fuzz target).
#ifndef OUTRUN_VERSION
#define OUTRUN_VERSION "0.0.0"
#endif

namespace outrun::protocol {
struct RegisterMsg;
struct UnregisterMsg;
struct ControlMsg;
struct DefineTagsMsg;
struct RemoveTagsMsg;
struct ListTagsMsg;
struct SourceUpdatesMsg;
struct SubscribeMsg;
struct ReadTagsMsg;
}  // namespace outrun::protocol

namespace outrun::tags::file {
struct Declarations;
}

namespace outrun::daemon {

struct Conn;
class TagsLane;

// outrund's loop thread (the Host's loop thread, which serves the clients too: design/daemon.md
// "One loop"; the fuzz target's own): it alone touches the state marked GUARDED_BY(loop_thread)
// (connections, the script table, the quotas, the listening socket); functions that need it are
// REQUIRES(loop_thread), and the entry points libuv calls assert it (a thread-id check in every
// build). One per process: one Server at a time.
inline ThreadRole loop_thread;

// The evaluations of an Evaluate frame (EvaluateMsg::items), as the verified frame holds them.
using EvaluationItems = flatbuffers::Vector<flatbuffers::Offset<wire::Evaluation>>;

struct Counters {
  std::array<std::atomic<uint64_t>, kStatusCount> by_status{};
  std::atomic<uint64_t> inflight{0};
  LatencyHistogram latency;
  std::unique_ptr<LatencyHistogram[]> shard_latency;  // by Result::shard; sized at start
  int shards = 0;
};

class Server {
 public:
  explicit Server(DaemonConfig cfg);
  ~Server();
  // Starts the host and the socket, serves until SIGTERM/SIGINT, drains, stops. Returns the
  // process exit code.
  int run();

  // Internal, used by connections.
  void want_write(const std::shared_ptr<Conn>& c) EXCLUDES(wake_mu_);
  Counters& counters() { return counters_; }
  // The tags lane (TagsLane, D-tags-lane): one of the tags engine's evaluations, queued in the
  // lane's place in its shard's ring; `done` gets the result. Any thread.
  void submit_tag_evaluation(Request rq, Callback done);

  // Scheduler. A submitted run of evaluations (one Host call), what its callbacks need.
  struct RunItem {
    Conn* conn;                          // kept alive by its Run's `conns`
    std::shared_ptr<ScriptEntry> entry;  // null in the tags lane
    uint64_t id = 0, t0 = 0;
    uint32_t uid = 0;  // the sender's (Conn::uid): a crash is charged to it (crash_budget_)
    Callback done;     // the tags lane's: called with the result instead of writing it
  };
  struct Run {
    int shard = 0;
    uint64_t sent_us = 0;
    std::vector<RunItem> items;
    // The clients of `items`, one reference per client's turn in the fill rather than one per
    // evaluation (each is an atomic increment and decrement on the loop's hot path).
    std::vector<std::shared_ptr<Conn>> conns;
  };
  struct Done {  // a completion, for the window's accounting
    uint64_t sent_us, now_us;
    bool ran;  // a worker ran it (its duration says something about the shard's service time)
  };

  // Test seam, no code in the daemon: tests/fuzz/fuzz_daemon_client.cpp defines this to start
  // the Host and the loop as run() does (minus signals) and drive one client at a time through
  // the real accept, read and frame handling (design/fuzzing.md).
  friend struct ServerTestAccess;

 private:
  static void on_listen(uv_poll_t* h, int status, int events);
  static void on_conn(uv_poll_t* h, int status, int events);
  static void on_async(uv_async_t* h);
  static void on_signal(uv_signal_t* h, int sig);
  static void on_drain_timer(uv_timer_t* h);
  static void on_hello_timer(uv_timer_t* h);
  // After a burst, once nothing is in flight: gives the loop thread's free heap memory back to
  // the system (mi_collect), at most once per hello-timer tick and once per burst (design/daemon.md
  // "Memory after a burst").
  void maybe_trim() REQUIRES(loop_thread);
  static void on_accept_pause(uv_timer_t* h);

  // On the loop thread (Host::post_to_loop): the daemon's handles on the Host's loop, then
  // serving. Every one is closed by finish().
  void start_serving(uv_loop_t* loop);
  // finish() tells run() the daemon's handles are closed (their close callbacks run on the loop
  // before the Host, destroyed next, lets it end).
  void served() EXCLUDES(served_mu_);
  bool open_socket(std::string* err);
  bool check_fd_limit(std::string* err);
  void pause_accepting(int err) REQUIRES(loop_thread);
  void accept_all() REQUIRES(loop_thread);
  void conn_event(Conn* c, int status, int events) REQUIRES(loop_thread);
  void handle_frames(const std::shared_ptr<Conn>& c) REQUIRES(loop_thread);
  // The check handle that refills the shards this loop turn's frames queued to (RefillDue).
  static void on_refill_check(uv_check_t* h);
  static void on_poll_prepare(uv_prepare_t* h);
  void refill_due() REQUIRES(loop_thread);
  void start_refill_check() REQUIRES(loop_thread);
  void close_refill_check() REQUIRES(loop_thread);
  // The hello, then one handler per message body. False: a violation.
  bool handle_frame(const std::shared_ptr<Conn>& c, const wire::Frame* frame) REQUIRES(loop_thread);
  // Register, Unregister (scripts.cpp).
  void handle_register(const std::shared_ptr<Conn>& c, const protocol::RegisterMsg& r)
      REQUIRES(loop_thread);
  void handle_unregister(const std::shared_ptr<Conn>& c, const protocol::UnregisterMsg& u)
      REQUIRES(loop_thread);
  // Stats, Shards, ListScripts, KillShard, RestartShard (control.cpp).
  void handle_control(const std::shared_ptr<Conn>& c, const protocol::ControlMsg& ctl)
      REQUIRES(loop_thread);
  // The tags frames (tags_frames.cpp).
  void handle_define_tags(const std::shared_ptr<Conn>& c, const protocol::DefineTagsMsg& d)
      REQUIRES(loop_thread);
  void handle_remove_tags(const std::shared_ptr<Conn>& c, const protocol::RemoveTagsMsg& r)
      REQUIRES(loop_thread);
  void handle_list_tags(const std::shared_ptr<Conn>& c, const protocol::ListTagsMsg& l)
      REQUIRES(loop_thread);
  void handle_source_updates(const std::shared_ptr<Conn>& c, const protocol::SourceUpdatesMsg& u)
      REQUIRES(loop_thread);
  void handle_subscribe(const std::shared_ptr<Conn>& c, const protocol::SubscribeMsg& sb)
      REQUIRES(loop_thread);
  void handle_read_tags(const std::shared_ptr<Conn>& c, const protocol::ReadTagsMsg& r)
      REQUIRES(loop_thread);
  // Admits and queues the items of an Evaluate frame (`items`: null when it has none) from
  // `start`; false when it stopped because the client is over
  // max_client_queued_bytes (the rest waits in Conn::paused_*).
  bool evaluate_items(const std::shared_ptr<Conn>& c, const EvaluationItems* items, uint32_t start)
      REQUIRES(loop_thread);

  // Scheduler (design/daemon.md "Scheduler"). Any thread: the loop after queueing, a shard's
  // dispatcher after a completion (`done`: only when the window is a quarter free).
  void init_scheduler() REQUIRES(loop_thread);
  void refill(int shard, const Done* done);
  void complete(Run& run, std::size_t i, Result&& r);
  // Destroys the Host with host_ still set: its last callbacks (the ends of what was in flight)
  // run while it is destroyed and use host_ (unique_ptr::reset clears it first).
  void destroy_host();
  // HostOptions::after_loop_callbacks, once per run of the Host's callbacks: flushes now, or in
  // this turn's check phase when the run was a read in the poll phase. The Host's loop thread.
  void corked_run_ended();
  // Writes each client's corked results (Conn::corked) of this loop turn: one frame and one send
  // per client for the results of every shard read in the turn. The Host's loop thread.
  void flush_corked();
  // A client past kHardLimitFactor × its budget is disconnected by the loop (any thread).
  void check_hard_limit(const std::shared_ptr<Conn>& c);
  // Over budget (any thread): stop feeding and reading the client until it drains.
  bool over_budget(Conn& c);
  void hold(Conn* c) REQUIRES(loop_thread);
  // Resumes a held client below half the budget.
  void maybe_resume(Conn* c) REQUIRES(loop_thread);
  // At close: what waits in the daemon ends cancelled.
  void cancel_queued(Conn* c) REQUIRES(loop_thread);
  // Past kHardLimitFactor × the budget.
  void disconnect_over_limit(Conn* c) REQUIRES(loop_thread);

  // Tags (design/daemon.md "Tags"). on_tag_changes runs on the thread that completed a wave.
  void on_tag_changes(const std::vector<tags::Change>& changes) EXCLUDES(sub_mu_);
  // Sends the latest values kept for a subscriber that went over its budget, once its queue is
  // below it. Any thread; takes sub_mu_.
  void flush_subscriber(Conn* c) EXCLUDES(sub_mu_);
  void flush_subscribers() EXCLUDES(sub_mu_);
  // Runs `job` on the tags thread (define/remove/reload: they wait for waves to finish). False
  // when the queue is full.
  bool post_tags_job(std::function<void()> job) EXCLUDES(tq_mu_);
  void tags_thread_main() EXCLUDES(tq_mu_);
  // SIGHUP: the reload runs next on the tags thread, before any queued definition (several
  // SIGHUPs before it starts are one reload).
  void request_reload() EXCLUDES(tq_mu_);
  // A ReadTags that waits for on_read evaluations, on the tags read thread: per connection in
  // turn, at most max_tag_reads_per_client queued per connection. False: refused (Busy).
  bool post_read_job(uint64_t conn, std::function<void()> job) EXCLUDES(rq_mu_);
  void tags_read_thread_main() EXCLUDES(rq_mu_);
  // `covers`: the SIGHUPs received when it started (reload_seen_ then); its result is kept for
  // stats' "reload" (what `outrun reload`, systemd's ExecReload, waits for).
  void reload_tags(uint64_t covers) EXCLUDES(reload_mu_);
  // Reads cfg_.tags_file and applies it (replace_all; tags_strict), logging every error with
  // its FILE:LINE:COL (and adding each to *errors). False when nothing was applied (the file
  // could not be read, or strict).
  bool apply_tags_file(const char* when, std::vector<std::string>* errors = nullptr);
  // A SIGHUP was received (loop thread); with no tags file it is done at once.
  void note_sighup() EXCLUDES(reload_mu_);
  // Opens the state store in cfg_.state_dir (made 0700 if missing) and gives the engine's options
  // what it holds. False (logged): no store can be made there.
  bool open_state_store(tags::TagsOptions* to);
  // One ListTags page (design/protocol.md "Paged ListTags"): after the cursor `after` ("" the
  // first page), at most `limit` tags (0: the default).
  Error tags_list_json(std::string_view after, uint32_t limit, std::string* out) const;
  void close_conn(Conn* c, const char* why) REQUIRES(loop_thread);
  void update_poll(Conn* c) REQUIRES(loop_thread);
  void begin_drain() REQUIRES(loop_thread);
  void finish() REQUIRES(loop_thread);
  void wake() EXCLUDES(wake_mu_);
  void reopen_logs();

  std::string stats_json(bool shards_only) const REQUIRES(loop_thread);
  // One ListScripts page (design/protocol.md "Paged ListScripts"): `after` is the cursor of the
  // previous page ("" the first), `limit` 0 the default.
  Error scripts_json(std::string_view after, uint32_t limit, std::string* out) const
      REQUIRES(loop_thread);
  // Why `c` (its uid, not an admin) may not replace or unregister `key`, which `owner` registered
  // (`what`: "replace", "unregister"); none when it may.
  Error check_owner(const Conn& c, std::string_view key, uint32_t owner, const char* what) const
      REQUIRES(loop_thread);

  // Shards whose queues evaluate_items added to during this loop turn: refilled once each in its
  // check phase (on_refill_check), after every client's reads of the turn.
  struct RefillDue {
    std::vector<uint8_t> shards;
    bool any = false;
  };
  RefillDue refill_due_ GUARDED_BY(loop_thread);

  DaemonConfig cfg_;
  // Clients with corked results (the Host's loop thread only). Before host_: the Host's last
  // callbacks, while it is destroyed, may still use it.
  std::vector<std::shared_ptr<Conn>> corked_;
  std::unique_ptr<Host> host_;
  // The Host's (run()), or own_loop_ (the fuzz target, which runs it on a thread of its own).
  uv_loop_t* loop_ = nullptr;
  uv_loop_t own_loop_{};
  Mutex served_mu_;
  CondVar served_cv_;
  bool served_ GUARDED_BY(served_mu_) = false;
  uv_poll_t listen_poll_{};
  uv_async_t async_{};
  uv_signal_t sigterm_{}, sigint_{}, sighup_{};
  uv_timer_t drain_timer_{};
  uv_check_t refill_check_{};
  // Between the loop's prepare and check phases (in_poll_) a run of the Host's callbacks is one
  // worker's read; its corked results wait for the check phase (flush_deferred_), so a turn that
  // read several shards writes each client one frame. Set only in outrund, whose handles share
  // the Host's loop (the fuzz target flushes at the end of each run).
  uv_prepare_t poll_prepare_{};
  bool in_poll_ = false;
  bool flush_deferred_ = false;
  // The clock of this run of the Host's callbacks (0: not read yet): every result of one read
  // from a worker was received at once, one clock read serves them all.
  uint64_t run_now_us_ = 0;
  // The same for the frames handle_frames takes from one read of a client: their evaluations'
  // queueing starts (evaluate_items).
  uint64_t frames_now_us_ GUARDED_BY(loop_thread) = 0;
  // Connections that have not said hello close after hello_timeout (hello_timer_); accept()
  // failing with EMFILE/ENFILE stops the listening poll for a pause (accept_pause_timer_), so
  // the loop does not spin on a socket that stays readable. Both exist once run() made them.
  uv_timer_t hello_timer_{}, accept_pause_timer_{};
  bool timers_ GUARDED_BY(loop_thread) = false;
  uint64_t trimmed_at_ GUARDED_BY(loop_thread) = 0;  // evaluations ended at the last collect
  uint64_t trims_ GUARDED_BY(loop_thread) = 0;
  bool accept_paused_ GUARDED_BY(loop_thread) = false;
  std::chrono::steady_clock::time_point last_accept_warning_ GUARDED_BY(loop_thread){};
  uint64_t accept_failures_ GUARDED_BY(loop_thread) = 0;  // EMFILE/ENFILE since the last warning
  int listen_fd_ = -1;
  // Starting, listening, draining, finished (design/daemon.md "Lifecycle"): moved by
  // start_serving, begin_drain and finish, on the loop thread. served_ above is the main
  // thread's side of the last move, under its own mutex.
  Lifecycle life_ GUARDED_BY(loop_thread);
  std::chrono::steady_clock::time_point started_ GUARDED_BY(loop_thread);
  std::chrono::steady_clock::time_point drain_deadline_ GUARDED_BY(loop_thread);

  Mutex wake_mu_;
  bool wake_open_ GUARDED_BY(wake_mu_) = false;  // async_ may be sent on
  std::vector<std::shared_ptr<Conn>> want_write_ GUARDED_BY(wake_mu_);

  // Loop thread only.
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns_ GUARDED_BY(loop_thread);
  // Connections before their hello, by id (accept order).
  std::map<uint64_t, Conn*> pending_ GUARDED_BY(loop_thread);
  uint64_t next_conn_id_ GUARDED_BY(loop_thread) = 1;
  uint64_t clients_total_ GUARDED_BY(loop_thread) = 0, clients_refused_ GUARDED_BY(loop_thread) = 0;
  uint64_t violations_ GUARDED_BY(loop_thread) = 0;
  // The entries of the records handed out, by id and by key, and the per-uid charges
  // (script_table.h). Evaluations in flight share an entry.
  ScriptTable scripts_ GUARDED_BY(loop_thread);
  // Worker deaths charged to the uid that sent the evaluation (design/daemon.md "Crash budget");
  // any thread. The Host's log lines go through host_log_limit_ (its sink: any thread).
  CrashBudget crash_budget_;
  std::shared_ptr<LogRateLimit> host_log_limit_;
  // Charges a result that killed its worker to `uid`; logs the cool-down it starts.
  void charge_crash(uint32_t uid, uint64_t now_us);
  // A result's log lines into its script's ring (and outrund's log at debug level). Any thread.
  void record_script_logs(ScriptEntry& e, const Result& r);
  // What the scripts' rings hold together (daemon.max_log_bytes). Static: an entry (and its
  // ring) may be let go after the Server (one per process).
  static inline detail::LogBudget script_log_budget_;
  // ScriptLogs: the ring of `key`'s current registration (its owner or an admin); TagLogs.
  Error script_logs_json(const Conn& c, std::string_view key, uint64_t since, uint32_t limit,
                         std::string* out) REQUIRES(loop_thread);
  Error tag_logs_json(std::string_view id, uint64_t since, uint32_t limit, std::string* out);

  Counters counters_;

  // Scheduler: one per shard (made with the Host), and the loop's scratch for one frame's
  // admitted evaluations per shard (kept for its capacity).
  std::unique_ptr<ShardSched[]> sched_;
  std::vector<std::vector<Queued>> admit_ GUARDED_BY(loop_thread);
  std::atomic<uint64_t> queued_peak_bytes_{0};  // largest writer queue seen at a check
  std::atomic<uint64_t> over_limit_{0};         // disconnected past the hard limit
  std::atomic<uint64_t> held_total_{0};         // clients held (loop or dispatcher)
  std::chrono::steady_clock::time_point last_limit_warning_ GUARDED_BY(loop_thread){};
  uint64_t limit_warnings_skipped_ GUARDED_BY(loop_thread) = 0;

  // Tags: the engine over host_ (made after it, destroyed before it), its subscribers (guarded
  // by sub_mu_, with each Conn's subscription) and the thread that runs define/remove/reload.
  std::unique_ptr<tags::Engine> tags_;
  // What the engine runs on (made before it, destroyed after it), and the lane's place in the
  // scheduler: a Conn with no socket, in each shard's ring like a client (made by
  // init_scheduler).
  std::unique_ptr<TagsLane> tags_runner_;
  std::shared_ptr<Conn> tags_lane_;
  // The tags' state store (state_dir; null without one): made before the engine, closed (its
  // last rows committed) after the engine is gone.
  std::shared_ptr<StateStore> state_store_;
  Mutex sub_mu_;
  std::unordered_map<Conn*, std::shared_ptr<Conn>> subscribers_ GUARDED_BY(sub_mu_);
  std::thread tags_thread_;
  std::atomic<uint64_t> tags_reads_{0};  // ReadTags waiting on the tags thread (the drain waits)
  Mutex tq_mu_;
  CondVar tq_cv_;  // a job, or tq_stop_
  std::deque<std::function<void()>> tq_ GUARDED_BY(tq_mu_);
  bool tq_stop_ GUARDED_BY(tq_mu_) = false;
  bool reload_requested_ GUARDED_BY(tq_mu_) = false;
  // SIGHUPs received, the count a finished reload covered, and its result (stats "reload").
  mutable Mutex reload_mu_;
  uint64_t reload_seen_ GUARDED_BY(reload_mu_) = 0;
  uint64_t reload_covered_ GUARDED_BY(reload_mu_) = 0;
  bool reload_ok_ GUARDED_BY(reload_mu_) = true;
  std::vector<std::string> reload_errors_ GUARDED_BY(reload_mu_);
  std::atomic<bool> tags_stopping_{false};  // jobs stop between ids once set
  // The reads that wait for on_read evaluations: their own thread (never in front of a reload
  // or a definition), each connection's queue in turn.
  std::thread tags_read_thread_;
  Mutex rq_mu_;
  CondVar rq_cv_;
  std::map<uint64_t, std::deque<std::function<void()>>> rq_ GUARDED_BY(rq_mu_);
  std::deque<uint64_t> rq_ring_ GUARDED_BY(rq_mu_);  // connections with reads queued, in turn
  std::size_t rq_count_ GUARDED_BY(rq_mu_) = 0;
  // The [[source]] and [[alarm]] declarations of the tags defined (design/tags.md "Sources and
  // alarms"): set on the tags thread with each apply, served by ListTags on the loop.
  mutable Mutex decls_mu_;
  std::shared_ptr<const tags::file::Declarations> decls_ GUARDED_BY(decls_mu_);
  // Sets them after an apply: `replace` (a whole file, replace_all) or merged by id.
  void set_declarations(tags::file::Declarations d, bool replace) EXCLUDES(decls_mu_);
};

}  // namespace outrun::daemon
