// outrun::Host::Impl: the loop, the registry, the compiler, start and shutdown, and routing and
// admission; the rest is its owners' (design/architecture.md "The pieces"): reading a shard's
// results (detail::ShardReader, shard_reader.h), deaths and restarts (detail::Supervisor,
// supervisor.h), crash attribution (detail::Quarantine, quarantine.h), the slow lane
// (detail::SlowLane, slow_lane.h). Threads and what they own (design/threading.md):
//  - caller threads (submit.cpp): encode under the shard's mutex; write frames themselves
//    (FrameWriter), never block on a full socket.
//  - the loop thread (libuv; workers.cpp, supervise.cpp, the reader, the supervisor): worker
//    processes, their sockets (reads, writes handed off), status pages, timers, child exits.
//    Completes evaluations: releases the slot, then fulfils futures or hands callbacks to the
//    shard's dispatcher.
//  - one dispatcher thread per shard: runs callbacks.
//  - a caller in evaluate_sync (leader.cpp) may read its shard's results itself (the reader's
//    lead) while it holds the shard's read token (leader/follower); it runs no callback and owns
//    no handle.
#pragma once

#include <flatbuffers/flatbuffers.h>
#include <time.h>
#include <uv.h>

#include <atomic>
#include <cassert>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "clock.h"
#include "compiler.h"
#include "completion.h"
#include "log.h"
#include "outrun/host.h"
#include "outrun/protocol/messages.h"
#include "quarantine.h"
#include "script_registry.h"
#include "shard.h"
#include "shard_reader.h"
#include "slow_lane.h"
#include "supervisor.h"
#include "thread_scratch.h"
#include "wire_codec.h"

namespace outrun {

struct Host::Impl final : detail::WorkerEvents {
  explicit Impl(const HostOptions& o)
      : opts(o),
        log(o.log),
        registry(this, static_cast<uint32_t>(o.shards), o.max_script_bytes, /*deferred_ids=*/true),
        lane(o.slow_lane ? o.shards : -1),  // one more shard, the last (D-slow-lane)
        slow(lane, o.slow_lane_release_after, o.slow_lane_max_in_flight),
        quarantine({o.crash_loop_window, o.quarantine_after, o.quarantine_cooldown}, log),
        reader(loop_role, log,
               {o.callbacks_on_loop, o.fulfill_futures_on_loop, o.after_loop_callbacks}, slow,
               started, *this) {}

  using Ended = detail::Ended;

  HostOptions opts;
  detail::Log log;
  detail::ScriptRegistry registry;
  std::string worker_path;
  // The workers' environment when it differs from the host's (worker_large_pages): built once
  // at start, null-terminated; empty = inherit.
  std::vector<std::string> worker_env_strings;
  std::vector<char*> worker_env;
  uint64_t timeout_us = 0;

  uv_loop_t loop{};
  uv_async_t wakeup{};
  uv_timer_t shutdown_timer{};
  std::thread loop_thread;
  ThreadRole loop_role;                                // the loop thread: bound when it starts
  std::vector<std::unique_ptr<detail::Shard>> shards;  // the home shards, then the slow lane
  // The slow lane (design/decisions.md D-slow-lane): its index in `shards` (opts.shards), or -1.
  const int lane;
  detail::SlowLane slow;  // who is in it, the moves
  // Where an evaluation of `r` goes now: one relaxed load of a flag the record already shares a
  // cache line with (unregistered, quarantine), no hashing, no lookup.
  detail::Shard& route(const detail::ScriptRecord& r) const {
    return *shards[r.slow.load(std::memory_order_relaxed) ? static_cast<uint32_t>(lane) : r.shard];
  }
  detail::Quarantine quarantine;  // crash attribution: charged by the supervisor, read by all
  // Threads waiting on this host's futures (shutdown closes it before the shards go).
  std::shared_ptr<detail::WaitGate> future_gate = std::make_shared<detail::WaitGate>();
  // The compile-only process (null: bytecode_cache_bytes 0). Created before the loop thread
  // starts; its loop-side members are the loop thread's.
  std::unique_ptr<detail::Compiler> compiler;
  flatbuffers::FlatBufferBuilder loop_fbb GUARDED_BY(loop_role){4096};  // Forget frames

  std::atomic<bool> stopping{false};
  Mutex wakeup_mu;  // uv_async_send on a closed handle aborts
  bool wakeup_open GUARDED_BY(wakeup_mu) = false;
  void wake();  // any thread: run on_wakeup on the loop (no-op once closed)
  bool shutdown_started GUARDED_BY(loop_role) = false;
  int live_workers GUARDED_BY(loop_role) = 0;  // WorkerProcess objects not yet freed

  // Requests from other threads to the loop (drills), and the application's (post_to_loop).
  enum class CommandKind : uint8_t { kKill, kRestart };
  Mutex commands_mu;
  std::vector<std::pair<CommandKind, int>> commands GUARDED_BY(commands_mu);
  std::vector<std::function<void(uv_loop_t*)>> posted GUARDED_BY(commands_mu);
  bool post(std::function<void(uv_loop_t*)>&& fn);
  void run_posted() REQUIRES(loop_role);
  // The loop thread's body: uv_run, with busy polling (opts.busy_poll) while evaluations are in
  // flight.
  void run_loop() REQUIRES(loop_role);
  bool any_in_flight();

  // Start-up: the loop thread reports hellos and early failures here.
  detail::StartReport started;
  // Reads each shard's results, on the loop or by a leader.
  detail::ShardReader reader;
  // Deaths and restarts; made by start() once the shards are (their timers).
  std::unique_ptr<detail::Supervisor> supervisor;

  bool on_loop_thread() const { return loop_role.here(); }
  // `sh`'s loop-only members are this loop thread's: its role is this host's (checked in debug
  // builds). For the analysis, which cannot tell sh.loop_role is loop_role.
  void on_loop([[maybe_unused]] const detail::Shard& sh) const REQUIRES(loop_role)
      ASSERT_CAPABILITY(sh.loop_role) {
    assert(&sh.loop_role == &loop_role);
  }

  // submit.cpp (any thread)
  // `encoded` not empty: sent instead of `inputs`, as they are (EncodedInputs).
  // `to` not null: the shard route() chose for it already (a waiter waits on that shard).
  void submit(const Script& script, Inputs&& inputs, detail::Completion&& done,
              EncodedInputs&& encoded = {}, detail::Shard* to = nullptr);
  // Has the loop poll `sh` again if it stopped for a leader that has gone and nobody else asked.
  void resume_if_paused(detail::Shard& sh);
  void submit_batch(std::vector<Request>&& requests, BatchCallback&& cb);
  // Admission's first step, the one check of the refusals that need no shard's lock, for an
  // evaluation and for each item of a batch alike: a handle not from this host, an
  // unregistered script, a quarantined one. Sets `*sh` to where the evaluation goes or where its
  // refusal is delivered (`to`, else its route; shard 0 for a foreign handle); false with
  // `*refusal` set when refused.
  bool admissible(const detail::ScriptRecord* r, detail::Shard* to, detail::Shard** sh,
                  Result* refusal);
  void deliver_now(detail::Shard& sh, detail::Completion&& done, Result&& r);
  // The Evaluation of slot `idx` (kSending), with its script's source or bytecode if the worker
  // lacks it; the slot is marked sent (SlotTable::mark_sent), so the caller writes it now.
  flatbuffers::Offset<wire::Evaluation> build_evaluation(flatbuffers::FlatBufferBuilder& f,
                                                         detail::Shard& sh, uint32_t idx,
                                                         detail::InputsOffset inputs,
                                                         detail::InputBufferOffset buffer = 0)
      REQUIRES(sh.mu);
  static std::span<const uint8_t> finish_evaluate(
      flatbuffers::FlatBufferBuilder& f, const flatbuffers::Offset<wire::Evaluation>* items,
      std::size_t n);

  // Sends or parks evaluations that just took their key's flight (or were re-sent), ending the
  // quarantined ones. The loop thread or a leader (the thread's own builder): the reader and the
  // supervisor place what they promote here.
  void place_promoted(detail::Shard& sh, std::vector<uint32_t>& promoted, Ended* out)
      REQUIRES(sh.mu);
  void send_slots(detail::Shard& sh, const std::vector<uint32_t>& idxs) REQUIRES(sh.mu);

  // leader.cpp (caller threads): evaluate_sync, leader/follower (design/threading.md): a waiting
  // caller leads (the reader's lead) whenever the token is handed to it.
  Result evaluate_sync(const Script& script, Inputs&& inputs);
  void wait_for_result(detail::Shard& sh, detail::SyncWaiter& me);

  // workers.cpp (loop thread): the worker's events, and what the host does with them.
  Error spawn(detail::Shard& sh) REQUIRES(loop_role);
  detail::SpawnSpec worker_spec(int shard) const;
  void on_worker_created(detail::WorkerProcess* w) override;
  void on_worker_exit(detail::WorkerProcess* w) override;
  void on_worker_readable(detail::WorkerProcess* w) override;
  void on_worker_writable(detail::WorkerProcess* w) override;
  void on_worker_stream_error(detail::WorkerProcess* w) override;
  void on_worker_linger_expired(detail::WorkerProcess* w) override;
  void on_worker_freed(detail::WorkerProcess* w) override;
  // What the loop does about a read: the stream ended (stream_ended), or a violation (the
  // worker is killed for it).
  void act_on(detail::Shard& sh, detail::WorkerProcess* w, detail::ShardReader::LoopRead&& r)
      REQUIRES(loop_role);
  void stream_ended(detail::WorkerProcess* w) REQUIRES(loop_role);
  void flush_writer(detail::WorkerProcess* w) REQUIRES(loop_role);

  // supervise.cpp (loop thread)
  static void on_wakeup(uv_async_t* a);
  void run_commands() REQUIRES(loop_role);
  // Freed records: Forget frames to their shards' workers, then their ids may be reused.
  void flush_forgets() REQUIRES(loop_role);
  void begin_shutdown() REQUIRES(loop_role);
  static void on_shutdown_timeout(uv_timer_t* t);
  void maybe_finish_shutdown() REQUIRES(loop_role);

  // host.cpp
  Error start();
  void shutdown();
};

namespace detail {

// The state behind a Host's outrun::Future: a SyncWaiter its caller waits in like evaluate_sync
// (leader.cpp), fulfilled through its Completion. Keeps the gate, not the host: waiting while
// the host lives passes the gate; afterwards the result is in (WaitGate).
struct HostFuture final : FutureState {
  HostFuture(Host::Impl& host, Shard& sh)
      : waiter(sh.reading), impl(&host), shard(&sh), gate(host.future_gate) {}
  void wait() override;
  bool wait_for(std::chrono::nanoseconds d) override;
  Result take() override;
  void abandon() override;
  // Has the loop poll its shard again if `owes_resume` (below).
  void settle_resume();

  // One waiting thread at a time: a waiter leads and follows as one SyncWaiter (design/threading.md
  // "A future's wait"); others wait for their turn, a timed one until its deadline. (Not a
  // std::timed_mutex: ThreadSanitizer does not see its timed lock.)
  bool take_turn(const std::chrono::steady_clock::time_point* deadline) EXCLUDES(turn_mu);
  void end_turn() EXCLUDES(turn_mu);
  Mutex turn_mu;
  CondVar turn_cv;  // turn_taken became false
  bool turn_taken GUARDED_BY(turn_mu) = false;
  SyncWaiter waiter;
  // Submitted while the loop did not poll its shard (a leader had stopped it) and nobody read it,
  // as the shard's only evaluation: instead of waking the loop to poll, submit left it to this
  // future's caller, who reads it when it waits (one wake-up, not three). A timed wait, an
  // abandoned future and the loop's watchdog (Host::Impl::on_watchdog) have the loop poll.
  std::atomic<bool> owes_resume{false};
  Host::Impl* const impl;
  Shard* const shard;
  const std::shared_ptr<WaitGate> gate;
};

}  // namespace detail

using detail::monotonic_ns;

// The calling thread's builder: a producer's evaluations, and what a reader (the loop or a
// leader) re-sends or promotes under the shard's mutex.
inline flatbuffers::FlatBufferBuilder& thread_builder() {
  OUTRUN_THREAD_SCRATCH(protocol::HotBuilder, fbb, 4096);
  return fbb;
}

// Backoff and crash-loop constants (see HostOptions for the configurable ones).
inline constexpr auto kMaxRestartDelay = std::chrono::milliseconds(5000);
inline constexpr auto kHealthyUptime = std::chrono::milliseconds(1000);
using detail::kLingerMs;
// Frames of evaluations are cut at this size so a large batch never nears kMaxFrameSize.
inline constexpr std::size_t kFrameCutBytes = 1u << 20;
inline constexpr std::size_t kFrameCutItems = 4096;
// A batch's frame takes no more evaluations once it is past this: one more adds at most a source
// or bytecode (1 MiB each) and its name, so the frame stays under kMaxFrameSize.
inline constexpr std::size_t kMaxBatchFrameBytes = protocol::kMaxFrameSize - (2u << 20);

}  // namespace outrun
