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

#include "acceptor.h"
#include "config.h"
#include "crash_budget.h"
#include "latency_histogram.h"
#include "lifecycle.h"
#include "log_rate_limit.h"
#include "log_ring.h"
#include "loop_thread.h"
#include "outrun/host.h"
#include "outrun/protocol/outrun_generated.h"
#include "outrun/tags.h"
#include "outrun/thread_annotations.h"
#include "registry_quota.h"
#include "scheduler.h"
#include "script_table.h"
#include "state_store.h"
#include "tags_service.h"

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

namespace outrun::daemon {

struct Conn;

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

  // Test seam, no code in the daemon: tests/fuzz/fuzz_daemon_client.cpp defines this to start
  // the Host and the loop as run() does (minus signals) and drive one client at a time through
  // the real accept, read and frame handling (design/fuzzing.md).
  friend struct ServerTestAccess;

 private:
  static void on_conn(uv_poll_t* h, int status, int events);
  static void on_async(uv_async_t* h);
  static void on_signal(uv_signal_t* h, int sig);
  static void on_drain_timer(uv_timer_t* h);
  static void on_hello_timer(uv_timer_t* h);
  // After a burst, once nothing is in flight: gives the loop thread's free heap memory back to
  // the system (mi_collect), at most once per hello-timer tick and once per burst (design/daemon.md
  // "Memory after a burst").
  void maybe_trim() REQUIRES(loop_thread);

  // On the loop thread (Host::post_to_loop): the daemon's handles on the Host's loop, then
  // serving. Every one is closed by finish().
  void start_serving(uv_loop_t* loop);
  // finish() tells run() the daemon's handles are closed (their close callbacks run on the loop
  // before the Host, destroyed next, lets it end).
  void served() EXCLUDES(served_mu_);
  // A peer the Acceptor let in: a connection (or refused: max_clients).
  void accept_peer(const Peer& p) REQUIRES(loop_thread);
  void conn_event(Conn* c, int status, int events) REQUIRES(loop_thread);
  void handle_frames(const std::shared_ptr<Conn>& c) REQUIRES(loop_thread);
  // The check handle that refills the shards this loop turn's frames queued to (RefillDue).
  static void on_refill_check(uv_check_t* h);
  static void on_poll_prepare(uv_prepare_t* h);
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

  // Makes the Scheduler (design/daemon.md "Scheduler") over host_: its fills go to
  // Host::evaluate_batch, their results to complete().
  void init_scheduler() REQUIRES(loop_thread);
  // A result: on the Host's loop thread or a shard's dispatcher. Written (or corked) to its
  // client, its window given back (Scheduler::refill).
  void complete(Run& run, std::size_t i, Result&& r);
  // Destroys the Host with host_ still set: its last callbacks (the ends of what was in flight)
  // run while it is destroyed and use host_ (unique_ptr::reset clears it first).
  void destroy_host();
  // HostOptions::after_loop_callbacks, once per run of the Host's callbacks: flushes now, or in
  // this turn's check phase when the run was a read in the poll phase. The Host's loop thread.
  void corked_run_ended() REQUIRES(loop_thread);
  // Writes each client's corked results (Conn::corked) of this loop turn: one frame and one send
  // per client for the results of every shard read in the turn. The Host's loop thread.
  void flush_corked();
  // A client past kHardLimitFactor × its budget is disconnected by the loop (any thread).
  void check_hard_limit(const std::shared_ptr<Conn>& c);
  // Over budget: stop feeding and reading the client until it drains.
  void hold(Conn* c) REQUIRES(loop_thread);
  // Resumes a held client below half the budget.
  void maybe_resume(Conn* c) REQUIRES(loop_thread);
  // At close: what waits in the daemon ends cancelled.
  void cancel_queued(Conn* c) REQUIRES(loop_thread);
  // Past kHardLimitFactor × the budget.
  void disconnect_over_limit(Conn* c) REQUIRES(loop_thread);

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

  DaemonConfig cfg_;
  // Clients with corked results (the Host's loop thread only). Before host_: the Host's last
  // callbacks, while it is destroyed, may still use it.
  std::vector<std::shared_ptr<Conn>> corked_;
  std::unique_ptr<Host> host_;
  // The Host's (run()), or own_loop_ (the fuzz target, which runs it on a thread of its own).
  uv_loop_t* loop_ GUARDED_BY(loop_thread) = nullptr;
  uv_loop_t own_loop_{};
  Mutex served_mu_;
  CondVar served_cv_;
  bool served_ GUARDED_BY(served_mu_) = false;
  uv_async_t async_{};
  uv_signal_t sigterm_{}, sigint_{}, sighup_{};
  uv_timer_t drain_timer_{};
  uv_check_t refill_check_{};
  // Between the loop's prepare and check phases (in_poll_) a run of the Host's callbacks is one
  // worker's read; its corked results wait for the check phase (flush_deferred_), so a turn that
  // read several shards writes each client one frame. Set only in outrund, whose handles share
  // the Host's loop (the fuzz target flushes at the end of each run).
  uv_prepare_t poll_prepare_{};
  bool in_poll_ GUARDED_BY(loop_thread) = false;
  bool flush_deferred_ GUARDED_BY(loop_thread) = false;
  // The clock of this run of the Host's callbacks (0: not read yet): every result of one read
  // from a worker was received at once, one clock read serves them all.
  uint64_t run_now_us_ = 0;
  // The same for the frames handle_frames takes from one read of a client: their evaluations'
  // queueing starts (evaluate_items).
  uint64_t frames_now_us_ GUARDED_BY(loop_thread) = 0;
  // Connections that have not said hello close after hello_timeout (hello_timer_), which exists
  // once start_serving made it.
  uv_timer_t hello_timer_{};
  bool timers_ GUARDED_BY(loop_thread) = false;
  uint64_t trimmed_at_ GUARDED_BY(loop_thread) = 0;  // evaluations ended at the last collect
  uint64_t trims_ GUARDED_BY(loop_thread) = 0;
  // The listening socket and accepting (acceptor.h); new connections come to accept_peer.
  Acceptor acceptor_{cfg_, [this](const Peer& p) {
                       loop_thread.assert_here();
                       accept_peer(p);
                     }};
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

  // The windows, rings and queues (scheduler.h), made with the Host (its shard count) and
  // destroyed before it (the queues hold its scripts). Set before serving, then only used.
  std::unique_ptr<Scheduler> sched_;
  std::atomic<uint64_t> over_limit_{0};  // disconnected past the hard limit
  std::chrono::steady_clock::time_point last_limit_warning_ GUARDED_BY(loop_thread){};
  uint64_t limit_warnings_skipped_ GUARDED_BY(loop_thread) = 0;

  // The tags engine, its threads, queues, subscribers and state store (tags_service.h): started
  // after host_, stopped before it.
  TagsService tags_{cfg_};
};

}  // namespace outrun::daemon
