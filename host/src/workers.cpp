// Worker processes (loop thread): spawn, and the worker's events handed to their owners (the
// reader reads, the supervisor handles deaths).
#include <cassert>
#include <cstring>
#include <random>

#include "host_impl.h"
#include "outrun/platform/worker_os.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/worker_exit.h"

namespace outrun {

using detail::Completion;
using detail::DeathCause;
using detail::Shard;
using detail::ShardState;
using detail::Slot;
using detail::WorkerProcess;
using protocol::FrameWriter;

detail::SpawnSpec Host::Impl::worker_spec(int shard) const {
  detail::SpawnSpec spec;
  spec.path = worker_path;
  spec.shard = shard;
  spec.env = worker_env.empty() ? nullptr : const_cast<char**>(worker_env.data());
  spec.args = {"--host-pid",
               std::to_string(platform::current_pid()),
               "--memory-limit",
               std::to_string(opts.memory_limit),
               "--script-budget",
               std::to_string(opts.worker_script_budget),
               "--heartbeat-ms",
               std::to_string(opts.heartbeat_interval.count()),
               "--address-space-limit",
               std::to_string(opts.worker_address_space_limit)};
  return spec;
}

Error Host::Impl::spawn(Shard& sh) {
  on_loop(sh);
  detail::SpawnSpec spec = worker_spec(sh.index);
  if (!opts.worker_profile_prefix.empty()) {
    // The pid is not known before the spawn: the worker appends it (see worker/main.cpp).
    spec.args.push_back("--profile");
    spec.args.push_back(opts.worker_profile_prefix);
  }
  Shard* shp = &sh;
  WorkerProcess* w = nullptr;
  if (Error e = WorkerProcess::spawn(
          &loop, &sh, this, &log, spec,
          [this, shp] {
            shp->write_blocked.store(true, std::memory_order_release);
            wake();
          },
          &w))
    return e;
  sh.worker = w;
  sh.pid.store(w->pid(), std::memory_order_relaxed);
  sh.worker_started_ns.store(w->started_ns(), std::memory_order_relaxed);
  sh.starts.fetch_add(1, std::memory_order_relaxed);
  {
    MutexLock lock(sh.stats_mu);
    sh.stats_page = w->page_region();
  }
  sh.reading.attach(w);  // leaders may read it from now on; its poll runs
  {
    MutexLock lock(sh.mu);
    sh.writer = w->writer();
    sh.set_state(ShardState::kRunning);
    std::fill(sh.known.begin(), sh.known.end(), 0);
    std::vector<uint32_t> waiting = sh.table.take_waiting();
    if (!waiting.empty()) send_slots(sh, waiting);
  }
  supervisor->started(sh, *w);
  return {};
}

void Host::Impl::on_worker_created(WorkerProcess*) {
  loop_role.assert_here();
  ++live_workers;
}

void Host::Impl::on_worker_freed(WorkerProcess*) {
  loop_role.assert_here();
  --live_workers;
  maybe_finish_shutdown();
}

void Host::Impl::on_worker_exit(WorkerProcess* w) {
  loop_role.assert_here();
  Shard& sh = w->shard();
  on_loop(sh);
  const auto& x = *w->exit_status();
  supervisor->worker_died(sh, w, x.cause(), platform::describe_exit(x.code, x.signal));
}

void Host::Impl::on_worker_readable(WorkerProcess* w) {
  loop_role.assert_here();
  Shard& sh = w->shard();
  on_loop(sh);
  act_on(sh, w, reader.loop_read(sh, w));
}

void Host::Impl::act_on(Shard& sh, WorkerProcess* w, detail::ShardReader::LoopRead&& r) {
  on_loop(sh);
  if (r.ended)
    stream_ended(w);
  else if (!r.violation.empty())
    supervisor->kill_worker(sh, w, DeathCause::kProtocol, "violated the protocol: " + r.violation);
}

void Host::Impl::on_worker_writable(WorkerProcess* w) {
  loop_role.assert_here();
  flush_writer(w);
}

void Host::Impl::on_worker_stream_error(WorkerProcess* w) {
  loop_role.assert_here();
  stream_ended(w);
}

// The worker's stream ended (EOF, or a reset when it died with unread input). Usually the
// process is exiting and its exit status, which names the cause, arrives within milliseconds:
// stop reading and wait for it. A worker still running after kLingerMs closed its pipe on
// purpose and is killed.
void Host::Impl::stream_ended(WorkerProcess* w) {
  w->shard().reading.drop_source(w);  // leaders stop reading it
  w->end_stream(kLingerMs);
}

void Host::Impl::on_worker_linger_expired(WorkerProcess* w) {
  loop_role.assert_here();
  Shard& sh = w->shard();
  on_loop(sh);
  if (w->life() == WorkerProcess::Life::kStreamEnded)
    supervisor->kill_worker(sh, w, DeathCause::kProtocol, "closed its pipe but kept running");
  else if (w->restart_requested())
    supervisor->kill_worker(sh, w, DeathCause::kRequested,
                            "did not stop after restart_shard and was killed");
}

void Host::Impl::flush_writer(WorkerProcess* w) {
  switch (w->writer()->flush_from_loop()) {
    case FrameWriter::Flush::kMore:
      return;
    case FrameWriter::Flush::kClosed:
      // A send failed (EPIPE, ECONNRESET, ...): the worker is dying or broke its socket. Wait
      // for its exit status like at end-of-stream; a worker still running after that is killed.
      stream_ended(w);
      return;
    case FrameWriter::Flush::kDone:
      w->unwatch_writable();
      return;
  }
}

}  // namespace outrun
