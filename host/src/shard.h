// One shard: the slot table of its evaluations, its current worker process, its restart policy,
// its dispatcher.
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

// Leader/follower (design/threading.md "Leader/follower"): who reads the current worker's result
// socket and its FrameReader. At most one holder at a time: the loop thread while it reads, or
// one caller blocked in evaluate_sync (the leader), which reads until its own result is in and
// then hands the token to another waiting caller, to the loop when it asked, or to nobody.
struct ReadToken {
  enum class Holder : uint8_t { kNone, kLoop, kLeader };

  ReadToken();   // the kick eventfd
  ~ReadToken();  // closes it
  ReadToken(const ReadToken&) = delete;
  ReadToken& operator=(const ReadToken&) = delete;

  Mutex mu;  // after Shard::mu when both are held; also guards every SyncWaiter of the shard
  Holder holder GUARDED_BY(mu) = Holder::kNone;
  // holder != kNone, readable without `mu`: a submitter reads it under Shard::mu (must_resume),
  // which every change to kNone is made under too (the releases), so it never misses a release.
  std::atomic<bool> held{false};
  void set_holder(Holder h) REQUIRES(mu) {
    holder = h;
    held.store(h != Holder::kNone, std::memory_order_relaxed);
  }
  // The worker a leader may read: set when it is spawned, cleared (so nobody takes the token
  // for it again) when its stream ended, a violation was found, or its death is handled.
  WorkerProcess* source GUARDED_BY(mu) = nullptr;
  // Callers waiting for their result that would lead if handed the token, in arrival order.
  std::vector<SyncWaiter*> followers GUARDED_BY(mu);
  // The loop waits for the token (a death to handle): the holder hands it to the loop first.
  bool loop_wants GUARDED_BY(mu) = false;
  CondVar loop_cv;  // holder became kLoop for a loop that wants it
  // What a leader left to the loop: a frame it does not handle (put back in the reader), an
  // end of stream or a read error (loop: read again), or a protocol violation it found.
  bool handoff_read GUARDED_BY(mu) = false;
  std::string handoff_violation GUARDED_BY(mu);
  // The loop stopped polling the result socket because a leader held the token (written on the
  // loop under mu; read by submitters under Shard::mu, see Host::Impl::submit), and a wake-up
  // to resume it is on its way.
  std::atomic<bool> loop_paused{false};
  std::atomic<bool> resume_asked{false};
  // An eventfd the leader polls next to the result socket: written to stop it (the loop wants
  // the token, or its own result was delivered by another thread).
  int kick_fd = -1;
  void kick() const;
  // The capability: the source's FrameReader and result fd. Acquired by whoever set `holder`.
  Baton token;
};

// A caller waiting for one result: in evaluate_sync (on its stack), or on a Host's future
// (HostFuture, host_impl.h). Its fields are guarded by its shard's ReadToken::mu, so a deliverer
// wakes it (under that mutex) before the caller can return. One thread waits on it at a time.
struct SyncWaiter {
  explicit SyncWaiter(ReadToken& r) : rd(r) {}
  ReadToken& rd;
  // The thread in wait_for_result (none before it, and none for a timed wait on a future): a
  // result that thread read itself wakes nobody.
  std::thread::id thread GUARDED_BY(rd.mu);
  CondVar cv;  // done or has_token
  bool done GUARDED_BY(rd.mu) = false;
  // `done`, readable without rd.mu: set (release) after `result`, under rd.mu. A future asked
  // after its host is gone reads only this and the result.
  std::atomic<bool> ready{false};
  bool has_token GUARDED_BY(rd.mu) = false;  // handed the token (or took it): it leads
  Result result GUARDED_BY(rd.mu);
};

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
  Shard(int i, const RestartConfig& restart) : index(i), policy(i, restart) {}

  const int index;

  Mutex mu;  // caller threads (submission) and the loop thread (results, deaths) meet here
  ShardState state GUARDED_BY(mu) = ShardState::kDown;
  SlotTable table GUARDED_BY(mu);
  std::vector<uint8_t> known GUARDED_BY(mu);  // script ids whose source the current worker has
  // The current worker's writer; null while down. Producers copy it under mu and write after.
  std::shared_ptr<protocol::FrameWriter> writer GUARDED_BY(mu);
  std::string unavailable_reason GUARDED_BY(mu);  // kCrashLoop: the `unavailable` message

  // Loop thread only (Host::Impl::loop_role).
  WorkerProcess* worker = nullptr;
  uv_timer_t restart_timer{};
  uv_timer_t watchdog{};  // heartbeat age and the running evaluation's T+G deadline
  RestartPolicy policy;
  std::vector<Delivery> to_dispatch;       // scratch: results of one read by the loop
  std::atomic<bool> write_blocked{false};  // a producer handed the rest of a write to the loop

  std::unique_ptr<Dispatcher> dispatcher;
  ReadToken reading;

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
