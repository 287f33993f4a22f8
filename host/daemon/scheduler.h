// outrund's scheduler (design/daemon.md "Scheduler", "Owners"): the evaluations a client sent wait
// per client and per shard until their shard's window W has room; the Scheduler owns the
// windows, the rings of clients and the queues, and fills each window from the clients in turn.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "loop_thread.h"
#include "outrun/runner.h"
#include "outrun/thread_annotations.h"

namespace outrun::daemon {

struct Conn;
struct ScriptEntry;

// One evaluation a client sent, waiting for its shard's window.
struct Queued {
  Request rq;
  std::shared_ptr<ScriptEntry> entry;
  uint64_t id = 0;     // the client's Evaluation.id
  uint64_t t0 = 0;     // when it was read, µs (latency)
  uint32_t uid = 0;    // the sender's: a crash it causes is charged to it (D-crash-budget)
  Callback done = {};  // the tags lane's (TagsLane): gets the result; a client's is empty
};

// One client's queue for one shard. Guarded by that shard's ShardSched::mu.
struct ConnShard {
  std::deque<Queued> q;
  bool in_ring = false;  // in ShardSched::ring
};

// Window bounds: W = clamp(kWindowTargetUs / service, kWindowMin, kWindowMax), with `service`
// the shard's smoothed time per evaluation (from completions).
inline constexpr double kWindowTargetUs = 2000;
inline constexpr uint32_t kWindowMin = 2;
inline constexpr uint32_t kWindowMax = 1024;
inline constexpr uint32_t kQuantum = 16;  // evaluations a client may take per turn

struct ShardSched {
  // Guards everything below and every Conn's ConnShard of this shard (Conn::sched[shard]: not
  // annotated, an array indexed by shard).
  Mutex mu;
  // Clients with queued evaluations for this shard that may be fed (not held), in turn order.
  std::deque<Conn*> ring GUARDED_BY(mu);
  uint32_t used GUARDED_BY(mu) = 0;                        // submitted to the Host, not completed
  uint32_t window GUARDED_BY(mu) = 8;                      // W, from service_us
  double service_us GUARDED_BY(mu) = kWindowTargetUs / 8;  // smoothed time per evaluation
  // The last completion (service = done - max(sent, this)).
  uint64_t last_done_us GUARDED_BY(mu) = 0;
  uint64_t queued GUARDED_BY(mu) = 0;  // in the clients' queues
};

// A submitted run of evaluations (one Host call), what its callbacks need.
struct RunItem {
  Conn* conn;                          // kept alive by its Run's `conns`
  std::shared_ptr<ScriptEntry> entry;  // null in the tags lane
  uint64_t id = 0, t0 = 0;
  uint32_t uid = 0;  // the sender's (Conn::uid): a crash is charged to it (crash budget)
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

// The per-shard windows, rings and queues. Made once the Host (its shard count) is. Its loop
// functions are the loop thread's; refill, over_budget, hold and submit_lane any thread's (the
// loop, or a shard's dispatcher completing).
class Scheduler {
 public:
  // Hands one fill to the Host: one call for `batch`, whose i-th result is `run->items[i]`'s
  // (the Server's complete() gives the window back with refill(shard, &done)). Called with no
  // lock held.
  using Submit = std::function<void(std::vector<Request> batch, std::shared_ptr<Run> run)>;
  // A client a fill found over its budget and held (any thread, no lock held): the loop stops
  // reading it and watches it drain.
  using Held = std::function<void(const std::shared_ptr<Conn>&)>;

  Scheduler(int shards, std::size_t max_client_queued_bytes, Submit submit, Held held);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  int shards() const { return n_; }
  // A new client's queues, one per shard (Conn::sched).
  std::unique_ptr<ConnShard[]> make_queues() const;

  // Over max_client_queued_bytes (any thread); the largest queue seen is kept (stats' peak).
  bool over_budget(Conn& c);
  // Marks `c` held (neither read nor fed until it drains); true when it was not (counted).
  bool hold(Conn& c);
  // The loop: a held client drained: fed again (back in the rings it has queues in, those
  // shards refilled). The Server decides when (below half its budget).
  void resume(Conn& c) REQUIRES(loop_thread);

  // The loop, reading a frame: one admitted evaluation for `shard`, kept until queue_admitted.
  void admit(uint32_t shard, Queued q) REQUIRES(loop_thread) {
    admit_[shard].push_back(std::move(q));
  }
  // The loop: the frame's admitted evaluations into `c`'s queues (in the rings unless it is
  // held); their shards are refilled once each in the turn's check phase (refill_due).
  void queue_admitted(Conn& c) REQUIRES(loop_thread);
  void refill_due() REQUIRES(loop_thread);
  // Fills shard `s`'s window from the clients in turn, kQuantum each, and submits what it took as
  // one Host call. `done`: a completion, whose window accounting happens first; the window is
  // then refilled only once a quarter of it is free (or it is empty).
  void refill(int s, const Done* done);
  // The tags engine's evaluation (TagsLane, D-tags-lane), any thread: queued in the lane's place
  // in shard `s`'s ring, which takes its turns with the clients'; then a refill.
  void submit_lane(int s, Queued q);
  // The loop, when `c` closes: what it has queued leaves the rings and ends `cancelled` (counted
  // in each entry); how many. What is in the Host finishes.
  uint64_t cancel(Conn& c) REQUIRES(loop_thread);

  // Stats: one shard's window.
  struct WindowStats {
    uint32_t size = 0, used = 0;
    double service_us = 0;
    uint64_t queued = 0;          // in the clients' queues (the lane's included)
    std::size_t clients = 0;      // in the ring
    std::size_t lane_queued = 0;  // the tags lane's
  };
  WindowStats window(int s) const;
  uint64_t held_total() const { return held_total_.load(std::memory_order_relaxed); }
  uint64_t queued_peak_bytes() const { return queued_peak_bytes_.load(std::memory_order_relaxed); }

 private:
  const int n_;
  const std::size_t max_client_queued_bytes_;
  const Submit submit_;
  const Held held_;
  std::unique_ptr<ShardSched[]> shards_;
  // The tags lane: a Conn with no socket, in each shard's ring like a client; never read, never
  // written to, never held (nothing is queued to its writer).
  std::shared_ptr<Conn> lane_;
  // The loop's scratch for one frame's admitted evaluations per shard (kept for its capacity).
  std::vector<std::vector<Queued>> admit_ GUARDED_BY(loop_thread);
  // Shards whose queues queue_admitted added to during this loop turn: refilled once each in its
  // check phase, after every client's reads of the turn.
  std::vector<uint8_t> due_ GUARDED_BY(loop_thread);
  bool any_due_ GUARDED_BY(loop_thread) = false;
  std::atomic<uint64_t> queued_peak_bytes_{0};  // largest writer queue seen at a check
  std::atomic<uint64_t> held_total_{0};         // clients held (loop or dispatcher)
};

// Steady clock, µs: queueing latency and the windows' service times.
inline uint64_t now_us() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace outrun::daemon
