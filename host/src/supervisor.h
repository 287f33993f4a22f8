// Deaths and restarts of a host's workers (design/supervision.md): the watchdog of each shard's
// worker (heartbeat age, the running evaluation's T+G deadline), the host's kills, the sequence of
// a death over its owners ("Who does what in a death"), the restart timer and the crash loop.
// Loop thread only.
//
// Owns, per shard, what only it uses: the restart timer, the watchdog timer and the restart policy
// (Watch). Its dependencies are fixed at construction: the loop, the log, the shard reader (a dead
// worker's last words, deliveries), crash attribution (Quarantine), the slow lane, where start-up
// waits (a worker that died before its hello), the host's stopping flag, and the host, Host::Impl,
// for three calls: spawn (a restart), place_promoted (what a death or a crash loop promotes is
// placed like a submission) and resume_if_paused (the watchdog has a paused shard polled).
#pragma once

#include <uv.h>

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "log.h"
#include "outrun/host.h"
#include "outrun/thread_annotations.h"
#include "quarantine.h"
#include "restart_policy.h"
#include "shard.h"
#include "shard_reader.h"
#include "slow_lane.h"

namespace outrun::detail {

class Supervisor {
 public:
  struct Config {
    std::chrono::milliseconds timeout{0}, grace{0}, silence_limit{0};
    RestartConfig restart;  // each shard's RestartPolicy
  };
  // Before the loop thread runs: a Watch per shard of `shards` (timers initialised on `loop`).
  Supervisor(uv_loop_t* loop, const ThreadRole& loop_role, const Log& log, const Config& config,
             const std::vector<std::unique_ptr<Shard>>& shards, const std::atomic<bool>& stopping,
             ShardReader& reader, Quarantine& quarantine, SlowLane& lane, StartReport& start,
             Host::Impl& host);
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // ---- The loop thread (REQUIRES(sh.loop_role): the host's role, which is the supervisor's).

  // A worker was just spawned for `sh`: the watchdog watches it.
  void started(Shard& sh, const WorkerProcess& w) REQUIRES(sh.loop_role);
  // The host decided `w` (`sh`'s) must go: records why (it decides the statuses), kills its group.
  void kill_worker(Shard& sh, WorkerProcess* w, DeathCause cause, const std::string& why,
                   uint64_t overrun_id = 0) REQUIRES(sh.loop_role);
  // First sign of a worker's death (exit, kill decision, end of stream + exit status). Idempotent
  // per worker. Sequences what each owner does ("Who does what in a death").
  void worker_died(Shard& sh, WorkerProcess* w, DeathCause cause, const std::string& why)
      REQUIRES(sh.loop_role);
  // What the dead worker had been sent (`exit`: its exit status, if reaped): the crash is charged
  // first (to a script, if one explains it: then `death->charged`), then the slot table settles
  // each evaluation as the restart policy says (retried, ahead of what waits, or ended).
  // Quarantined scripts' evaluations end. Under sh.mu.
  void settle_death(Shard& sh, const std::optional<ExitStatus>& exit, Death* death, bool stop,
                    Ended* ended) REQUIRES(sh.mu, sh.loop_role);
  // Asks the shard's restart policy what follows the death `d`, and does it: arms the restart
  // timer, or enters the crash loop.
  void after_death(Shard& sh, const Death& d) REQUIRES(sh.loop_role);
  // restart_shard on a shard with no worker (down, or in its crash loop): its crashes forgotten,
  // a worker started now.
  void restart_now(Shard& sh) REQUIRES(sh.loop_role);
  // Shutdown: no restart any more.
  void stop_restarts(Shard& sh) REQUIRES(sh.loop_role);
  // The end of shutdown, on the loop thread: every timer closed (uv_run returns once they are).
  void close();

  // Tests: whether `sh`'s restart timer is armed.
  bool restart_armed(const Shard& sh) const REQUIRES(sh.loop_role);

 private:
  // One shard's supervision. Reached only through watches_ (GUARDED_BY(loop_role_)) or by its
  // own timers' callbacks, which assert the loop's role first.
  struct Watch {
    Watch(Supervisor* s, Shard* shard, const RestartConfig& c)
        : self(s), sh(shard), policy(shard->index, c) {}
    Supervisor* const self;
    Shard* const sh;
    uv_timer_t restart_timer{};
    uv_timer_t watchdog{};  // heartbeat age and the running evaluation's T+G deadline
    RestartPolicy policy;
  };
  Watch& watch(const Shard& sh) REQUIRES(sh.loop_role) {
    mine(sh);
    return *watches_[static_cast<std::size_t>(sh.index)];
  }
  void mine([[maybe_unused]] const Shard& sh) const REQUIRES(sh.loop_role)
      ASSERT_CAPABILITY(loop_role_) {
    assert(&sh.loop_role == &loop_role_);
  }
  void record_death(Shard& sh, const WorkerProcess& w, const Death& death, bool stop)
      REQUIRES(sh.loop_role);
  void arm_watchdog(Shard& sh, int64_t now_ns) REQUIRES(sh.loop_role);
  static void on_watchdog(uv_timer_t* t);
  // Applies a decision (apply_restart): the crash loop, then the restart timer, once.
  void apply(Shard& sh, const RestartDecision& decision) REQUIRES(sh.loop_role);
  static void on_restart(uv_timer_t* t);
  // The shard's crash loop begins: `unavailable` (with `why`) for what waits and what comes.
  void enter_crash_loop(Shard& sh, const std::string& why) REQUIRES(sh.loop_role);

  const ThreadRole& loop_role_;
  const Log& log_;
  const Config config_;
  const int64_t hard_deadline_ns_;  // T + G
  const std::atomic<bool>& stopping_;
  ShardReader& reader_;
  Quarantine& quarantine_;
  SlowLane& lane_;
  StartReport& start_;
  Host::Impl& host_;
  std::vector<std::unique_ptr<Watch>> watches_ GUARDED_BY(loop_role_);  // by shard index
};

}  // namespace outrun::detail
