// One shard: the slot table of its evaluations, its current worker process, its read token, its
// dispatcher. (Its restart policy and timers are the supervisor's: supervisor.h.)
#pragma once

#include <uv.h>

#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "completion.h"
#include "outrun/protocol/frame_writer.h"
#include "outrun/runner.h"
#include "outrun/thread_annotations.h"
#include "read_token.h"
#include "restart_policy.h"
#include "slot_table.h"
#include "worker_process.h"

namespace outrun::detail {

enum class ShardState : uint8_t {
  kRunning,    // a worker is attached (possibly before its hello): evaluations are written to it
  kDown,       // no worker; evaluations wait in `waiting` until the restart
  kCrashLoop,  // no worker and no restart until the cool-down: evaluations end `unavailable`
  kStopping,   // the host is shutting down: Shutdown sent, no new evaluations
  kStopped,    // the worker is gone for good
};
const char* to_string(ShardState s);

// The threads waiting on a Host's futures: shutdown closes it once every evaluation has ended,
// and waits for them to leave before it destroys the shards they wait on. A future waited on
// after that finds its result in without touching its shard.
struct WaitGate {
  Mutex mu;
  CondVar cv;  // inside fell to 0 while closed
  bool open GUARDED_BY(mu) = true;
  int inside GUARDED_BY(mu) = 0;

  bool enter() EXCLUDES(mu) {
    MutexLock lock(mu);
    if (!open) return false;
    ++inside;
    return true;
  }
  void leave() EXCLUDES(mu) {
    MutexLock lock(mu);
    if (--inside == 0 && !open) cv.notify_all();
  }
  void close() EXCLUDES(mu) {
    MutexLock lock(mu);
    open = false;
    cv.wait(mu, [&]() REQUIRES(mu) { return inside == 0; });
  }
};

struct Shard {
  Shard(int i, const ThreadRole& loop) : index(i), loop_role(loop) {}

  const int index;
  // The host's loop thread (Host::Impl::loop_role, the same object): it alone touches the members
  // guarded by it. Host::Impl code that holds its own role says so with on_loop(sh).
  const ThreadRole& loop_role;

  Mutex mu;  // caller threads (submission) and the loop thread (results, deaths) meet here
  ShardState state GUARDED_BY(mu) = ShardState::kDown;
  SlotTable table GUARDED_BY(mu);
  std::vector<uint8_t> known GUARDED_BY(mu);  // script ids whose source the current worker has
  // The current worker's writer; null while down. Producers copy it under mu and write after.
  std::shared_ptr<protocol::FrameWriter> writer GUARDED_BY(mu);
  std::string unavailable_reason GUARDED_BY(mu);  // kCrashLoop: the `unavailable` message
  // `state`, and the copy stats read without the mutex.
  void set_state(ShardState s) REQUIRES(mu) {
    state = s;
    public_state.store(static_cast<int>(s), std::memory_order_relaxed);
  }

  // Loop thread only.
  WorkerProcess* worker GUARDED_BY(loop_role) = nullptr;
  std::atomic<bool> write_blocked{false};  // a producer handed the rest of a write to the loop

  std::unique_ptr<Dispatcher> dispatcher;
  ReadToken reading;  // who reads the current worker (read_token.h)

  // Counters (relaxed; read by stats).
  std::atomic<uint64_t> starts{0}, deaths{0}, evaluations{0}, reads{0}, frames{0}, retried{0};
  std::atomic<uint64_t> crashes_charged{0}, quarantine_refusals{0};
  std::atomic<uint64_t> futures_left_to_caller{0};
  std::atomic<uint64_t> by_cause[kDeathCauses] = {};
  std::atomic<int> pid{0};
  // CLOCK_MONOTONIC start of the current worker; 0 while down.
  std::atomic<int64_t> worker_started_ns{0};
  std::atomic<int> public_state{static_cast<int>(ShardState::kDown)};
  Mutex stats_mu;
  std::string last_death GUARDED_BY(stats_mu);
  std::shared_ptr<boost::interprocess::mapped_region> stats_page GUARDED_BY(stats_mu);
};

}  // namespace outrun::detail
