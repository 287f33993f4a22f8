// Supervision (loop thread): the deadline of the running evaluation, heartbeats, restarts with
// backoff and a crash-loop limit, drills, shutdown.
#include <signal.h>

#include <cassert>

#include "host_impl.h"
#include "outrun/protocol/messages.h"

namespace outrun {

using detail::DeathCause;
using detail::Shard;
using detail::ShardState;
using detail::WorkerProcess;

namespace {

uint64_t ceil_ms(int64_t ns) {
  return ns <= 0 ? 0 : static_cast<uint64_t>((ns + 999'999) / 1'000'000);
}

}  // namespace

const char* detail::to_string(ShardState s) {
  switch (s) {
    case ShardState::kRunning:
      return "running";
    case ShardState::kDown:
      return "down";
    case ShardState::kCrashLoop:
      return "crash_loop";
    case ShardState::kStopping:
      return "stopping";
    case ShardState::kStopped:
      return "stopped";
  }
  return "unknown";
}

void Host::Impl::set_state(Shard& sh, ShardState s) {
  sh.state = s;
  sh.public_state.store(static_cast<int>(s), std::memory_order_relaxed);
}

// One timer per shard watches its worker. It costs nothing per evaluation: the worker publishes
// the evaluation it runs and since when on its status page, and the timer reads it.
//  - Idle or far from any deadline, it wakes every min(T, silence_limit / 2).
//  - When an evaluation is running, it is armed for exactly that evaluation's since + T + G, so
//    an overrun is killed within a timer tick (1 ms) of its deadline.
//  - A heartbeat older than silence_limit kills the worker (frozen or SIGSTOPped).
void Host::Impl::arm_watchdog(Shard& sh, int64_t now_ns) {
  on_loop(sh);
  WorkerProcess* w = sh.worker;
  if (!w || w->dead()) return;
  const int64_t idle_period =
      std::min<int64_t>(hard_deadline_ns - std::chrono::nanoseconds(opts.grace).count(),
                        std::chrono::nanoseconds(opts.silence_limit).count() / 2);
  int64_t next = now_ns + std::max<int64_t>(idle_period, 1'000'000);
  uint64_t id = 0;
  int64_t since = 0;
  if (w->page() && protocol::read_running(*w->page(), &id, &since) && id != 0)
    next = std::min(next, since + hard_deadline_ns);
  sh.watchdog.data = &sh;
  uv_timer_start(&sh.watchdog, &Impl::on_watchdog, ceil_ms(next - now_ns), 0);
}

void Host::Impl::on_watchdog(uv_timer_t* t) {
  auto* sh = static_cast<Shard*>(t->data);
  Impl* self = static_cast<Impl*>(t->loop->data);
  self->loop_role.assert_here();
  self->on_loop(*sh);
  WorkerProcess* w = sh->worker;
  if (!w || w->dead()) return;
  const int64_t now = monotonic_ns();
  if (w->page()) {
    const int64_t beat =
        std::max(w->page()->heartbeat_ns.load(std::memory_order_relaxed), w->started_ns());
    const int64_t silent = now - beat;
    if (silent > std::chrono::nanoseconds(self->opts.silence_limit).count()) {
      self->kill_worker(w, DeathCause::kSilence,
                        "was silent for " + std::to_string(silent / 1'000'000) +
                            " ms (no heartbeat) and was killed");
      return;
    }
    uint64_t id = 0;
    int64_t since = 0;
    if (protocol::read_running(*w->page(), &id, &since) && id != 0 &&
        now >= since + self->hard_deadline_ns) {
      self->kill_worker(w, DeathCause::kOverrun,
                        "was killed: an evaluation ran past T+G (" +
                            std::to_string(self->opts.timeout.count()) + "+" +
                            std::to_string(self->opts.grace.count()) + " ms)",
                        id);
      return;
    }
  }
  // A future left to its caller (HostFuture::owes_resume) that nobody waits on is read by now.
  if (sh->reading.loop_paused()) self->resume_if_paused(*sh);
  self->arm_watchdog(*sh, now);
}

void Host::Impl::after_death(Shard& sh, const detail::Death& d) {
  on_loop(sh);
  apply(sh, sh.policy.on_death(d, detail::Clock::now()));
}

void Host::Impl::apply(Shard& sh, const detail::RestartDecision& decision) {
  on_loop(sh);
  sh.restart_timer.data = &sh;
  detail::apply_restart(&sh.restart_timer, &Impl::on_restart, decision,
                        [&](const std::string& why) {
                          loop_role.assert_here();
                          enter_crash_loop(sh, why);
                        });
}

void Host::Impl::enter_crash_loop(Shard& sh, const std::string& why) {
  on_loop(sh);
  log(LogLevel::error, "outrun: {}", why);
  Ended ended;
  std::vector<uint32_t> promoted;
  {
    MutexLock lock(sh.mu);
    set_state(sh, ShardState::kCrashLoop);
    sh.unavailable_reason = why;
    sh.table.end_waiting(Result{Status::unavailable, {}, why, sh.index}, &ended, &promoted);
    place_promoted(sh, promoted, &ended);
  }
  deliver_all(sh, ended);
}

void Host::Impl::on_restart(uv_timer_t* t) {
  auto* sh = static_cast<Shard*>(t->data);
  Impl* self = static_cast<Impl*>(t->loop->data);
  self->loop_role.assert_here();
  self->on_loop(*sh);
  if (self->stopping.load() || sh->worker) return;
  if (Error err = self->spawn(*sh)) {
    self->log(LogLevel::error, "outrun: shard {}: {}", sh->index, err.message);
    {
      MutexLock lock(sh->stats_mu);
      sh->last_death = "could not be started: " + err.message;
    }
    self->apply(*sh, sh->policy.on_start_failure(err.message, detail::Clock::now()));
  }
}

void Host::Impl::on_wakeup(uv_async_t* a) {
  Impl* self = static_cast<Impl*>(a->data);
  self->loop_role.assert_here();
  for (auto& sh : self->shards) {
    self->on_loop(*sh);
    if (sh->write_blocked.exchange(false, std::memory_order_acq_rel) && sh->worker)
      sh->worker->watch_writable();
    self->attend_reading(*sh);
  }
  self->flush_forgets();
  if (self->compiler) self->compiler->pump();
  self->run_posted();
  if (self->stopping.load() && !self->shutdown_started) {
    self->begin_shutdown();
    return;
  }
  self->run_commands();
}

// Records freed since the last wake-up (their last handle or evaluation let go): each shard's
// worker is told to drop their compiled states, in one Forget frame per shard (merged into the
// writer's batch), and only then are the ids given back for reuse. So a reused id's first
// Evaluation (with its source: `known` is cleared here) is always behind the Forget of the
// record that had it, on the same pipe (design/decisions.md D-unreg). A shard without a worker
// needs none: the next worker starts with no script.
void Host::Impl::flush_forgets() {
  std::vector<std::pair<uint32_t, uint32_t>> retired;
  registry.take_retired(&retired);
  if (retired.empty()) return;
  std::vector<std::vector<uint32_t>> by_shard(shards.size());
  std::vector<uint32_t> all;
  all.reserve(retired.size());
  for (auto [shard, id] : retired) {
    by_shard[shard].push_back(id);
    all.push_back(id);
  }
  if (lane >= 0) {
    // The slow lane may hold any script's state: a Forget for those it was sent.
    Shard& sh = *shards[static_cast<std::size_t>(lane)];
    MutexLock lock(sh.mu);
    for (uint32_t id : all)
      if (id < sh.known.size() && sh.known[id])
        by_shard[static_cast<std::size_t>(lane)].push_back(id);
  }
  constexpr std::size_t kMaxIdsPerFrame = 1u << 16;  // 256 KiB of ids: far below kMaxFrameSize
  auto& f = loop_fbb;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const auto& ids = by_shard[s];
    if (ids.empty()) continue;
    Shard& sh = *shards[s];
    MutexLock lock(sh.mu);
    for (uint32_t id : ids)
      if (id < sh.known.size()) sh.known[id] = 0;
    if (!sh.writer) continue;
    for (std::size_t k = 0; k < ids.size(); k += kMaxIdsPerFrame) {
      f.Clear();
      const std::size_t n = std::min(kMaxIdsPerFrame, ids.size() - k);
      // Nobody else is writing when this returns true: write now so the builder can be reused.
      if (sh.writer->enqueue(protocol::encode_forget(f, {ids.data() + k, n})))
        sh.writer->write_pending();
    }
  }
  registry.recycle(all);
}

bool Host::Impl::post(std::function<void(uv_loop_t*)>&& fn) {
  {
    MutexLock lock(commands_mu);
    if (stopping.load()) return false;
    posted.push_back(std::move(fn));
  }
  wake();
  return true;
}

void Host::Impl::run_posted() {
  std::vector<std::function<void(uv_loop_t*)>> fns;
  {
    MutexLock lock(commands_mu);
    fns.swap(posted);
  }
  for (auto& fn : fns) fn(&loop);
}

// The spin's test, several times per microsecond while it lasts: one relaxed load per shard, no
// lock (a submitter holds the shard's mutex while it writes to the worker).
bool Host::Impl::any_in_flight() NO_THREAD_SAFETY_ANALYSIS {
  for (auto& sh : shards)
    if (sh->table.in_use() != 0) return true;
  return false;
}

// D-busy-poll. uv_run(UV_RUN_ONCE) sleeps until something is ready and handles it; then, while
// evaluations are in flight, UV_RUN_NOWAIT polls every handle (epoll_wait with no timeout, the
// timers, the check handles) until opts.busy_poll has passed since the wake-up, and the loop
// sleeps again. Each wake-up buys one spin at most: a loop that is never idle (a pipelined load)
// spins no more than it would run anyway, and an idle one (nothing in flight) never spins.
void Host::Impl::run_loop() {
  if (opts.busy_poll.count() <= 0) {
    uv_run(&loop, UV_RUN_DEFAULT);
    return;
  }
  const int64_t spin_ns = static_cast<int64_t>(opts.busy_poll.count()) * 1000;
  while (uv_run(&loop, UV_RUN_ONCE) != 0) {
    const int64_t until = monotonic_ns() + spin_ns;
    while (any_in_flight() && monotonic_ns() < until)
      if (uv_run(&loop, UV_RUN_NOWAIT) == 0) return;
  }
}

void Host::Impl::run_commands() {
  std::vector<std::pair<CommandKind, int>> requested;
  {
    MutexLock lock(commands_mu);
    requested.swap(commands);
  }
  if (shutdown_started) return;  // shutdown ends every worker anyway
  for (auto [kind, i] : requested) {
    Shard& sh = *shards[static_cast<std::size_t>(i)];
    on_loop(sh);
    WorkerProcess* w = sh.worker;
    if (kind == CommandKind::kKill) {
      if (w && !w->dead())
        kill_worker(w, DeathCause::kRequested, "was killed on request (kill_shard)");
      continue;
    }
    // Restart: the worker answers what it has, exits; new evaluations wait for its successor.
    if (!w || w->dead()) {
      ShardState state;
      {
        MutexLock lock(sh.mu);
        state = sh.state;
      }
      if (state == ShardState::kCrashLoop || state == ShardState::kDown) {
        uv_timer_stop(&sh.restart_timer);
        sh.policy.reset();
        sh.restart_timer.data = &sh;
        on_restart(&sh.restart_timer);
      }
      continue;
    }
    // It must exit by itself within shutdown_timeout, or it is killed: what waits for its
    // successor must not wait forever.
    w->request_restart(static_cast<uint64_t>(opts.shutdown_timeout.count()));
    flatbuffers::FlatBufferBuilder f(64);
    const auto shutdown = protocol::encode_shutdown(f);
    std::shared_ptr<protocol::FrameWriter> writer;
    {
      MutexLock lock(sh.mu);
      if (sh.writer && sh.writer->enqueue(shutdown)) writer = sh.writer;
      sh.writer.reset();  // nothing more goes to this worker
      set_state(sh, ShardState::kDown);
    }
    if (writer) writer->write_pending();
  }
}

void Host::Impl::begin_shutdown() {
  shutdown_started = true;
  flatbuffers::FlatBufferBuilder f(64);
  const auto shutdown = protocol::encode_shutdown(f);
  for (auto& shp : shards) {
    Shard& sh = *shp;
    on_loop(sh);
    uv_timer_stop(&sh.restart_timer);
    std::shared_ptr<protocol::FrameWriter> writer;
    Ended ended;
    std::vector<uint32_t> promoted;
    {
      MutexLock lock(sh.mu);
      set_state(sh, sh.worker ? ShardState::kStopping : ShardState::kStopped);
      if (sh.writer && sh.writer->enqueue(shutdown)) writer = sh.writer;
      sh.table.end_waiting(
          Result{Status::cancelled, {}, "the host shut down before it ran", sh.index}, &ended,
          &promoted);
      place_promoted(sh, promoted, &ended);
    }
    if (writer) writer->write_pending();
    deliver_all(sh, ended);
  }
  if (compiler) compiler->shutdown();
  uv_timer_start(&shutdown_timer, &Impl::on_shutdown_timeout,
                 static_cast<uint64_t>(opts.shutdown_timeout.count()), 0);
  maybe_finish_shutdown();
}

void Host::Impl::on_shutdown_timeout(uv_timer_t* t) {
  Impl* self = static_cast<Impl*>(t->loop->data);
  self->loop_role.assert_here();
  for (auto& sh : self->shards) {
    self->on_loop(*sh);
    if (sh->worker)
      self->kill_worker(sh->worker, DeathCause::kRequested, "did not stop in time and was killed");
  }
}

void Host::Impl::maybe_finish_shutdown() {
  if (!shutdown_started || live_workers > 0 || (compiler && compiler->alive())) return;
  uv_timer_stop(&shutdown_timer);
  uv_close(reinterpret_cast<uv_handle_t*>(&shutdown_timer), nullptr);
  {
    MutexLock lock(wakeup_mu);
    wakeup_open = false;
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&wakeup), nullptr);
  for (auto& sh : shards) {
    uv_close(reinterpret_cast<uv_handle_t*>(&sh->restart_timer), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&sh->watchdog), nullptr);
  }
  // uv_run returns once these close callbacks have run: nothing is left on the loop.
}

}  // namespace outrun
