// outrund's scheduler (design/daemon.md "Scheduler"): the evaluations a client sent wait per
// client and per shard until their shard's window W has room. Server::refill fills it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>

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

// Steady clock, µs: queueing latency and the windows' service times.
inline uint64_t now_us() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace outrun::daemon
