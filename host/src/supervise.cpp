// The loop (loop thread): its wake-ups, drills, Forget frames, busy polling, shutdown. Deaths,
// restarts and the watchdog are the supervisor's (supervisor.h).
#include <cassert>

#include "host_impl.h"
#include "outrun/protocol/messages.h"

namespace outrun {

using detail::DeathCause;
using detail::Shard;
using detail::ShardState;
using detail::WorkerProcess;

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

void Host::Impl::on_wakeup(uv_async_t* a) {
  Impl* self = static_cast<Impl*>(a->data);
  self->loop_role.assert_here();
  for (auto& sh : self->shards) {
    self->on_loop(*sh);
    if (sh->write_blocked.exchange(false, std::memory_order_acq_rel) && sh->worker)
      sh->worker->watch_writable();
    if (WorkerProcess* w = sh->worker) self->act_on(*sh, w, self->reader.attend(*sh));
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
        supervisor->kill_worker(sh, w, DeathCause::kRequested,
                                "was killed on request (kill_shard)");
      continue;
    }
    // Restart: the worker answers what it has, exits; new evaluations wait for its successor.
    if (!w || w->dead()) {
      ShardState state;
      {
        MutexLock lock(sh.mu);
        state = sh.state;
      }
      if (state == ShardState::kCrashLoop || state == ShardState::kDown)
        supervisor->restart_now(sh);
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
      sh.set_state(ShardState::kDown);
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
    supervisor->stop_restarts(sh);
    std::shared_ptr<protocol::FrameWriter> writer;
    Ended ended;
    std::vector<uint32_t> promoted;
    {
      MutexLock lock(sh.mu);
      sh.set_state(sh.worker ? ShardState::kStopping : ShardState::kStopped);
      if (sh.writer && sh.writer->enqueue(shutdown)) writer = sh.writer;
      sh.table.end_waiting(
          Result{Status::cancelled, {}, "the host shut down before it ran", sh.index}, &ended,
          &promoted);
      place_promoted(sh, promoted, &ended);
    }
    if (writer) writer->write_pending();
    reader.deliver_all(sh, ended);
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
      self->supervisor->kill_worker(*sh, sh->worker, DeathCause::kRequested,
                                    "did not stop in time and was killed");
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
  supervisor->close();
  // uv_run returns once these close callbacks have run: nothing is left on the loop.
}

}  // namespace outrun
