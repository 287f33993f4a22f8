// outrund's tags service (design/daemon.md "Owners", "Tags"): the tags engine and what it runs
// on (the Scheduler's tags lane), its state store, the tags thread (define, remove, the SIGHUP
// reload) and its queue, the tags read thread (ReadTags that wait for on_read evaluations) and
// its per-connection queues, the subscribers, the declarations, the reload's result. The Server's
// tags frames (tags_frames.cpp) decode, check and answer; what they change goes through here.
#pragma once

#include <atomic>
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
#include "outrun/tags.h"
#include "outrun/thread_annotations.h"
#include "state_store.h"
#include "tags_lane.h"

namespace outrun::tags::file {
struct Declarations;
}

namespace outrun::daemon {

struct Conn;

class TagsService {
 public:
  // Jobs the tags thread may have waiting, and reads the read thread (all connections).
  static constexpr std::size_t kMaxJobs = 64;

  // `cfg` outlives the service.
  explicit TagsService(const DaemonConfig& cfg) : cfg_(cfg) {}
  ~TagsService() { stop(); }
  TagsService(const TagsService&) = delete;
  TagsService& operator=(const TagsService&) = delete;

  // Opens the state store (cfg.state_dir), makes the engine over `host` with its evaluations
  // through `lane` (the Scheduler's tags lane), applies cfg.tags_file, starts the threads. 0, or
  // outrund's exit code (logged): 1 no state store, 3 no engine, 2 the tags file not applied.
  int start(Runner& host, TagsLane::Submit lane);
  // The threads end (what they have queued is dropped: its connections are closed by now), then
  // the engine, then the state store (its last rows committed). Once; before the Host goes.
  void stop() EXCLUDES(tq_mu_, rq_mu_);
  // Set by stop(): jobs stop between ids.
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }

  // The engine, between start() and stop().
  tags::Engine& engine() const { return *engine_; }
  bool running() const { return engine_ != nullptr; }

  // Runs `job` on the tags thread (define/remove: they wait for waves to finish). False when
  // stopped or kMaxJobs are waiting.
  bool post_job(std::function<void()> job) EXCLUDES(tq_mu_);
  // A ReadTags that waits for on_read evaluations, on the read thread: per connection in turn,
  // at most max_tag_reads_per_client of one connection and kMaxJobs in all. False: refused. A
  // read counts in reads_waiting() from here until it has run.
  bool post_read(uint64_t conn, std::function<void()> job) EXCLUDES(rq_mu_);
  // Reads posted and not yet run (the drain waits for them).
  uint64_t reads_waiting() const { return reads_.load(std::memory_order_acquire); }

  // A SIGHUP was received (the loop); with no tags file it is done at once.
  void note_sighup() EXCLUDES(reload_mu_);
  // The reload runs next on the tags thread, before any queued job (several SIGHUPs before it
  // starts are one reload).
  void request_reload() EXCLUDES(tq_mu_);
  struct ReloadStats {
    uint64_t requested = 0, covered = 0;
    bool ok = true;
    std::vector<std::string> errors;
  };
  ReloadStats reload_stats() const EXCLUDES(reload_mu_);

  // The [[source]] and [[alarm]] declarations of the tags defined (design/tags.md "Sources and
  // alarms"), set after an apply: `replace` (a whole file) or merged by id.
  void set_declarations(tags::file::Declarations d, bool replace) EXCLUDES(decls_mu_);

  // Subscribe (design/daemon.md "Subscribers"): `ids` (none: all) added, or removed (`cancel`;
  // none: every one). Refused past max_subscribed_ids on one connection.
  Error subscribe(const std::shared_ptr<Conn>& c, bool cancel, const std::vector<std::string>& ids)
      EXCLUDES(sub_mu_);
  // `c` closed: never sent changes again; the source tags it created that no tag uses go.
  void forget(Conn& c) EXCLUDES(sub_mu_);
  // Sends the latest values kept for a subscriber that went over its budget, once its queue is
  // below half of it. Any thread.
  void flush_subscriber(Conn& c) EXCLUDES(sub_mu_);
  void flush_subscribers() EXCLUDES(sub_mu_);

  // One ListTags page (design/protocol.md "Paged ListTags"): after the cursor `after` ("" the
  // first page), at most `limit` tags (0: the default).
  Error list_json(std::string_view after, uint32_t limit, std::string* out) const
      EXCLUDES(decls_mu_);

 private:
  void jobs_main() EXCLUDES(tq_mu_);
  void reads_main() EXCLUDES(rq_mu_);
  // A wave's changes to the subscribers (the thread that completed it).
  void on_changes(const std::vector<tags::Change>& changes) EXCLUDES(sub_mu_);
  // `covers`: the SIGHUPs received when it started (reload_seen_ then); its result is kept for
  // stats' "reload" (what `outrun reload`, systemd's ExecReload, waits for).
  void reload(uint64_t covers) EXCLUDES(reload_mu_);
  // Reads cfg.tags_file and applies it (replace_all; tags_strict), logging every error with its
  // FILE:LINE:COL (and adding each to *errors). False when nothing was applied.
  bool apply_tags_file(const char* when, std::vector<std::string>* errors = nullptr);
  // Opens the state store in cfg.state_dir (made 0700 if missing) and gives the engine's
  // options what it holds. False (logged): no store can be made there.
  bool open_state_store(tags::TagsOptions* to);

  const DaemonConfig& cfg_;
  bool stopped_ = false;  // the thread that starts and stops it
  // What the engine runs on (made before it, destroyed after it), the engine, and its state
  // store (null without state_dir; made before the engine, closed after it).
  std::unique_ptr<TagsLane> lane_;
  std::unique_ptr<tags::Engine> engine_;
  std::shared_ptr<StateStore> store_;
  std::atomic<bool> stopping_{false};

  // The tags thread and its queue.
  std::thread jobs_thread_;
  Mutex tq_mu_;
  CondVar tq_cv_;  // a job, a reload, or tq_stop_
  std::deque<std::function<void()>> tq_ GUARDED_BY(tq_mu_);
  bool tq_stop_ GUARDED_BY(tq_mu_) = false;
  bool reload_requested_ GUARDED_BY(tq_mu_) = false;

  // The read thread and each connection's queue, served in turn.
  std::thread reads_thread_;
  std::atomic<uint64_t> reads_{0};
  Mutex rq_mu_;
  CondVar rq_cv_;
  std::map<uint64_t, std::deque<std::function<void()>>> rq_ GUARDED_BY(rq_mu_);
  std::deque<uint64_t> rq_ring_ GUARDED_BY(rq_mu_);  // connections with reads queued, in turn
  std::size_t rq_count_ GUARDED_BY(rq_mu_) = 0;

  // SIGHUPs received, the count a finished reload covered, and its result (stats "reload").
  mutable Mutex reload_mu_;
  uint64_t reload_seen_ GUARDED_BY(reload_mu_) = 0;
  uint64_t reload_covered_ GUARDED_BY(reload_mu_) = 0;
  bool reload_ok_ GUARDED_BY(reload_mu_) = true;
  std::vector<std::string> reload_errors_ GUARDED_BY(reload_mu_);

  mutable Mutex decls_mu_;
  std::shared_ptr<const tags::file::Declarations> decls_ GUARDED_BY(decls_mu_);

  // The subscribers (and, not annotated, each Conn's subscription fields: the analysis cannot
  // tell a Conn's fields are this service's).
  Mutex sub_mu_;
  std::unordered_map<Conn*, std::shared_ptr<Conn>> subscribers_ GUARDED_BY(sub_mu_);
};

}  // namespace outrun::daemon
