// Deaths and restarts (supervisor.h): the watchdog, kills, a death's sequence, restarts with
// backoff and a crash-loop limit.
#include "supervisor.h"

#include "host_impl.h"
#include "outrun/protocol/messages.h"

namespace outrun::detail {

namespace {

uint64_t ceil_ms(int64_t ns) {
  return ns <= 0 ? 0 : static_cast<uint64_t>((ns + 999'999) / 1'000'000);
}

}  // namespace

Supervisor::Supervisor(uv_loop_t* loop, const ThreadRole& loop_role, const Log& log,
                       const Config& config, const std::vector<std::unique_ptr<Shard>>& shards,
                       const std::atomic<bool>& stopping, ShardReader& reader,
                       Quarantine& quarantine, SlowLane& lane, StartReport& start, Host::Impl& host)
    : loop_role_(loop_role),
      log_(log),
      config_(config),
      hard_deadline_ns_(
          std::chrono::duration_cast<std::chrono::nanoseconds>(config.timeout + config.grace)
              .count()),
      stopping_(stopping),
      reader_(reader),
      quarantine_(quarantine),
      lane_(lane),
      start_(start),
      host_(host) {
  for (const auto& sh : shards) {
    auto w = std::make_unique<Watch>(this, sh.get(), config.restart);
    uv_timer_init(loop, &w->restart_timer);
    uv_timer_init(loop, &w->watchdog);
    w->restart_timer.data = w.get();
    w->watchdog.data = w.get();
    watches_.push_back(std::move(w));
  }
}

void Supervisor::close() {
  loop_role_.assert_here();
  for (auto& w : watches_) {
    uv_close(reinterpret_cast<uv_handle_t*>(&w->restart_timer), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&w->watchdog), nullptr);
  }
}

bool Supervisor::restart_armed(const Shard& sh) const {
  mine(sh);
  return uv_is_active(reinterpret_cast<const uv_handle_t*>(
             &watches_[static_cast<std::size_t>(sh.index)]->restart_timer)) != 0;
}

void Supervisor::started(Shard& sh, const WorkerProcess& w) {
  arm_watchdog(sh, w.started_ns());
}

// One timer per shard watches its worker. It costs nothing per evaluation: the worker publishes
// the evaluation it runs and since when on its status page, and the timer reads it.
//  - Idle or far from any deadline, it wakes every min(T, silence_limit / 2).
//  - When an evaluation is running, it is armed for exactly that evaluation's since + T + G, so
//    an overrun is killed within a timer tick (1 ms) of its deadline.
//  - A heartbeat older than silence_limit kills the worker (frozen or SIGSTOPped).
void Supervisor::arm_watchdog(Shard& sh, int64_t now_ns) {
  Watch& wt = watch(sh);
  WorkerProcess* w = sh.worker;
  if (!w || w->dead()) return;
  const int64_t idle_period =
      std::min<int64_t>(hard_deadline_ns_ - std::chrono::nanoseconds(config_.grace).count(),
                        std::chrono::nanoseconds(config_.silence_limit).count() / 2);
  int64_t next = now_ns + std::max<int64_t>(idle_period, 1'000'000);
  uint64_t id = 0;
  int64_t since = 0;
  if (w->page() && protocol::read_running(*w->page(), &id, &since) && id != 0)
    next = std::min(next, since + hard_deadline_ns_);
  uv_timer_start(&wt.watchdog, &Supervisor::on_watchdog, ceil_ms(next - now_ns), 0);
}

void Supervisor::on_watchdog(uv_timer_t* t) {
  Watch& wt = *static_cast<Watch*>(t->data);
  Supervisor& self = *wt.self;
  Shard& sh = *wt.sh;
  self.loop_role_.assert_here();
  assert(&sh.loop_role == &self.loop_role_);
  sh.loop_role.assert_here();
  WorkerProcess* w = sh.worker;
  if (!w || w->dead()) return;
  const int64_t now = monotonic_ns();
  if (w->page()) {
    const int64_t beat =
        std::max(w->page()->heartbeat_ns.load(std::memory_order_relaxed), w->started_ns());
    const int64_t silent = now - beat;
    if (silent > std::chrono::nanoseconds(self.config_.silence_limit).count()) {
      self.kill_worker(sh, w, DeathCause::kSilence,
                       "was silent for " + std::to_string(silent / 1'000'000) +
                           " ms (no heartbeat) and was killed");
      return;
    }
    uint64_t id = 0;
    int64_t since = 0;
    if (protocol::read_running(*w->page(), &id, &since) && id != 0 &&
        now >= since + self.hard_deadline_ns_) {
      self.kill_worker(sh, w, DeathCause::kOverrun,
                       "was killed: an evaluation ran past T+G (" +
                           std::to_string(self.config_.timeout.count()) + "+" +
                           std::to_string(self.config_.grace.count()) + " ms)",
                       id);
      return;
    }
  }
  // A future left to its caller (HostFuture::owes_resume) that nobody waits on is read by now.
  if (sh.reading.loop_paused()) self.host_.resume_if_paused(sh);
  self.arm_watchdog(sh, now);
}

void Supervisor::kill_worker(Shard& sh, WorkerProcess* w, DeathCause cause, const std::string& why,
                             uint64_t overrun_id) {
  if (w->dead()) return;
  w->decide_kill(cause, overrun_id);
  worker_died(sh, w, cause, why);
}

// It only sequences what each owner does (design/supervision.md "Who does what in a death"): the
// worker builds its Death record and is killed; the shard stops sending to it; the reader drains
// what it wrote; the slot table settles what it had been sent (retried or ended, as the restart
// policy says); the restart decision is applied, once.
void Supervisor::worker_died(Shard& sh, WorkerProcess* w, DeathCause cause,
                             const std::string& why) {
  Watch& wt = watch(sh);
  if (w->dead()) return;
  const bool stop = stopping_.load();
  // The worker: its Death record (the host's kill decision names the cause; the evaluation it
  // was running is read before anything else changes the page), then SIGKILL to its group.
  Death death = w->death(cause, why, Clock::now());
  w->mark_dead();
  {
    // The shard: nothing more goes to this worker; what draining promotes or re-sends waits for
    // the next one.
    MutexLock lock(sh.mu);
    if (sh.writer) sh.writer->close();
    sh.writer.reset();
    sh.set_state(stop ? ShardState::kStopped : ShardState::kDown);
  }
  // Its last words. Its socket and reader are the loop's from here: a leader that reads them is
  // stopped first.
  sh.reading.take_for_death(w);
  if (death.cause != DeathCause::kProtocol && w->reader().error() == protocol::FrameError::kNone)
    reader_.drain(sh, w);
  w->close_io();
  sh.reading.release_after_death();  // nobody reads `w` again
  uv_timer_stop(&wt.watchdog);

  record_death(sh, *w, death, stop);
  Ended ended;
  {
    MutexLock lock(sh.mu);
    settle_death(sh, w->exit_status(), &death, stop, &ended);
  }
  if (sh.worker == w) sh.worker = nullptr;
  sh.pid.store(0, std::memory_order_relaxed);
  sh.worker_started_ns.store(0, std::memory_order_relaxed);
  reader_.deliver_all(sh, ended);
  if (!w->greeted()) {
    MutexLock lock(start_.mu);
    if (start_.error.empty())
      start_.error = "worker " + std::to_string(w->pid()) + " " + why + " before its hello";
    start_.cv.notify_all();
  }
  if (!stop) after_death(sh, death);
}

// The log line, the shard's counters and its last death.
void Supervisor::record_death(Shard& sh, const WorkerProcess& w, const Death& death, bool stop) {
  const auto& exit = w.exit_status();
  const bool clean_exit = death.cause == DeathCause::kExit && exit && exit->clean();
  if (!stop && !clean_exit)
    log_(LogLevel::warn, "outrun: shard {} worker {} {}", sh.index, w.pid(), death.how);
  sh.deaths.fetch_add(1, std::memory_order_relaxed);
  if (!clean_exit)
    sh.by_cause[static_cast<int>(death.cause)].fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(sh.stats_mu);
  sh.last_death = death.how;
  sh.stats_page.reset();
}

void Supervisor::settle_death(Shard& sh, const std::optional<ExitStatus>& exit, Death* death,
                              bool stop, Ended* ended) {
  std::vector<uint32_t> promoted;
  // Charged before anything ends: a script this quarantines has its other evaluations (the
  // retries and what waits) ended below instead of sent to the next worker.
  const ScriptRecord* suspect =
      stop ? nullptr : Quarantine::suspect(sh.table, exit, death->cause, death->running);
  if (suspect) {
    sh.crashes_charged.fetch_add(1, std::memory_order_relaxed);
    quarantine_.charge(*suspect, exit, sh.index);
    death->charged = true;
    lane_.misbehaved(*suspect);  // the slow lane, while (or once) it is not quarantined
  }
  // The evaluation the death is charged to (Result::killed_worker): the crash's suspect, or the
  // one that overran; 0: none (evaluation ids start at 1).
  const uint64_t killer = stop                                   ? 0
                          : suspect                              ? death->running
                          : death->cause == DeathCause::kOverrun ? death->overrun_id
                                                                 : 0;
  const Death& d = *death;
  // The lambda runs here, on the loop thread, under sh.mu (the analysis does not carry the
  // loop's role into a lambda: it gets the policy's address, taken where the role is held).
  const RestartPolicy* policy = &watch(sh).policy;
  SlowLane* lane = &lane_;
  const int shard = sh.index;
  std::vector<uint32_t> retry = sh.table.settle(
      [&](uint64_t id, const Slot& slot) -> std::optional<Result> {
        EvaluationFate fate = policy->fate(d, stop, id, d.running, d.overrun_id, slot.retries);
        if (fate.retry) return std::nullopt;
        if (fate.status == Status::killed) lane->misbehaved(*record_of(slot.script));  // T+G
        Result r{fate.status, {}, std::move(fate.error), shard};
        r.killed_worker = killer != 0 && id == killer;
        return r;
      },
      ended, &promoted);
  Quarantine::end_quarantined(sh.table, shard, sh.quarantine_refusals, &retry, ended, &promoted);
  Quarantine::end_waiting(sh.table, shard, sh.quarantine_refusals, ended, &promoted);
  if (!retry.empty()) sh.retried.fetch_add(retry.size(), std::memory_order_relaxed);
  sh.table.requeue_retries(retry);
  if (stop)
    sh.table.end_waiting(Result{Status::cancelled, {}, "the host shut down before it ran", shard},
                         ended, &promoted);
  host_.place_promoted(sh, promoted, ended);
}

void Supervisor::after_death(Shard& sh, const Death& d) {
  apply(sh, watch(sh).policy.on_death(d, Clock::now()));
}

void Supervisor::apply(Shard& sh, const RestartDecision& decision) {
  Watch& wt = watch(sh);
  apply_restart(&wt.restart_timer, &Supervisor::on_restart, decision, [&](const std::string& why) {
    sh.loop_role.assert_here();
    enter_crash_loop(sh, why);
  });
}

void Supervisor::enter_crash_loop(Shard& sh, const std::string& why) {
  log_(LogLevel::error, "outrun: {}", why);
  Ended ended;
  std::vector<uint32_t> promoted;
  {
    MutexLock lock(sh.mu);
    sh.set_state(ShardState::kCrashLoop);
    sh.unavailable_reason = why;
    sh.table.end_waiting(Result{Status::unavailable, {}, why, sh.index}, &ended, &promoted);
    host_.place_promoted(sh, promoted, &ended);
  }
  reader_.deliver_all(sh, ended);
}

void Supervisor::on_restart(uv_timer_t* t) {
  Watch& wt = *static_cast<Watch*>(t->data);
  Supervisor& self = *wt.self;
  Shard& sh = *wt.sh;
  self.loop_role_.assert_here();
  sh.loop_role.assert_here();
  if (self.stopping_.load() || sh.worker) return;
  self.host_.loop_role.assert_here();  // the host's role is the supervisor's
  if (Error err = self.host_.spawn(sh)) {
    self.log_(LogLevel::error, "outrun: shard {}: {}", sh.index, err.message);
    {
      MutexLock lock(sh.stats_mu);
      sh.last_death = "could not be started: " + err.message;
    }
    self.apply(sh, wt.policy.on_start_failure(err.message, Clock::now()));
  }
}

void Supervisor::restart_now(Shard& sh) {
  Watch& wt = watch(sh);
  uv_timer_stop(&wt.restart_timer);
  wt.policy.reset();
  on_restart(&wt.restart_timer);
}

void Supervisor::stop_restarts(Shard& sh) {
  uv_timer_stop(&watch(sh).restart_timer);
}

}  // namespace outrun::detail
