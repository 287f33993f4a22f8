// Worker processes (loop thread): spawn, read, results, death.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/interprocess/shared_memory_object.hpp>
#include <cassert>
#include <cstring>
#include <random>

#include "host_impl.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/worker_exit.h"

namespace outrun {

using detail::Completion;
using detail::DeathCause;
using detail::Shard;
using detail::ShardState;
using detail::Slot;
using detail::SlotPlace;
using detail::WorkerProcess;
using protocol::FrameWriter;
namespace bip = boost::interprocess;

std::string describe_exit(int64_t status, int signal) {
  if (signal == SIGSYS)
    return "was killed by signal " + std::to_string(signal) +
           " (Bad system call): it made a system call its seccomp filter forbids";
  if (signal != 0)
    return "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return protocol::describe_worker_exit(status);
}

Error Host::Impl::spawn(Shard& sh) {
  detail::SpawnSpec spec;
  spec.path = worker_path;
  spec.shard = sh.index;
  spec.env = worker_env.empty() ? nullptr : worker_env.data();
  spec.args = {"--host-pid",
               std::to_string(getpid()),
               "--memory-limit",
               std::to_string(opts.memory_limit),
               "--script-budget",
               std::to_string(opts.worker_script_budget),
               "--heartbeat-ms",
               std::to_string(opts.heartbeat_interval.count()),
               "--address-space-limit",
               std::to_string(opts.worker_address_space_limit)};
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
  {
    MutexLock lock(sh.mu);
    sh.writer = w->writer();
    set_state(sh, ShardState::kRunning);
    std::fill(sh.known.begin(), sh.known.end(), 0);
    std::vector<uint32_t> waiting = sh.table.take_waiting();
    if (!waiting.empty()) send_slots(sh, waiting);
  }
  arm_watchdog(sh, w->started_ns());
  return {};
}

void Host::Impl::on_worker_created(WorkerProcess*) {
  ++live_workers;
}

void Host::Impl::on_worker_freed(WorkerProcess*) {
  loop_role.assert_here();
  --live_workers;
  maybe_finish_shutdown();
}

void Host::Impl::on_worker_exit(WorkerProcess* w) {
  loop_role.assert_here();
  const auto& x = *w->exit_status();
  const DeathCause cause = x.signal != 0 ? DeathCause::kCrash : DeathCause::kExit;
  worker_died(w, cause, describe_exit(x.code, x.signal));
}

void Host::Impl::on_worker_readable(WorkerProcess* w) {
  loop_role.assert_here();
  const long n = w->reader().read_from(w->result_fd());
  if (n == -EAGAIN) return;
  if (n <= 0) {  // EOF or ECONNRESET: what it wrote before is drained in worker_died
    stream_ended(w);
    return;
  }
  std::string violation;
  process_frames(w, &violation);
  if (!violation.empty())
    kill_worker(w, DeathCause::kProtocol, "violated the protocol: " + violation);
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
  w->end_stream(kLingerMs);
}

void Host::Impl::on_worker_linger_expired(WorkerProcess* w) {
  loop_role.assert_here();
  if (w->life() == WorkerProcess::Life::kStreamEnded)
    kill_worker(w, DeathCause::kProtocol, "closed its pipe but kept running");
  else if (w->restart_requested())
    kill_worker(w, DeathCause::kRequested, "did not stop after restart_shard and was killed");
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

// Handles every complete frame in the worker's reader; stops at the first violation.
void Host::Impl::process_frames(WorkerProcess* w, std::string* violation) {
  Shard& sh = w->shard();
  sh.reads.fetch_add(1, std::memory_order_relaxed);
  protocol::FrameView fv;
  while (violation->empty() && w->reader().next(fv)) {
    sh.frames.fetch_add(1, std::memory_order_relaxed);
    protocol::WorkerMessage m;
    if (!protocol::decode_worker_frame(fv.frame, &m, violation)) break;
    switch (fv.frame->body_type()) {
      case wire::Body::Hello: {
        if (w->greeted()) {
          *violation = "sent a second hello";
        } else {
          w->greet();
          MutexLock lock(start_mu);
          ++hellos;
          start_cv.notify_all();
        }
        break;
      }
      case wire::Body::Results:
        if (!w->greeted())
          *violation = "sent results before its hello";
        else
          handle_results(w, std::get<protocol::ResultsMsg>(m).items, violation);
        break;
      default:
        break;  // decode_worker_frame took it for a violation
    }
  }
  if (violation->empty() && w->reader().error() != protocol::FrameError::kNone)
    *violation = protocol::to_string(w->reader().error());
  if (!sh.to_dispatch.empty()) sh.dispatcher->post(sh.to_dispatch);
}

void Host::Impl::handle_results(WorkerProcess* w,
                                const flatbuffers::Vector<flatbuffers::Offset<wire::Result>>* items,
                                std::string* violation) {
  Shard& sh = w->shard();
  if (!items) return;
  // Check and release the slots under the lock; decode and deliver after it.
  thread_local std::vector<std::pair<Completion, protocol::ResultView>> done;
  thread_local Ended ended;
  done.clear();
  std::vector<uint32_t> resend, promoted;
  {
    MutexLock lock(sh.mu);
    for (const wire::Result* item : *items) {
      const uint64_t id = item->id();
      const uint32_t idx = static_cast<uint32_t>(id);
      Slot* found = sh.table.sent(id);
      if (!found) {
        *violation = "answered an evaluation it was not running (id " + std::to_string(id) + ")";
        break;
      }
      Slot& slot = *found;
      protocol::ResultView r;
      if (!protocol::decode_worker_result(item, &r, violation)) break;
      if (r.status == wire::Status::NeedSource) {
        if (slot.source_resent) {
          *violation = "asked twice for the source of evaluation " + std::to_string(id);
          break;
        }
        slot.source_resent = true;
        const uint32_t sid = slot.script.record()->id;
        if (sid < sh.known.size()) sh.known[sid] = 0;
        slot.place = SlotPlace::kWaiting;
        resend.push_back(idx);
        continue;
      }
      // Release the slot (and the key's flight) now: a caller that awaited this result and
      // submits again must never be refused by its own finished evaluation.
      done.emplace_back(sh.table.release(idx, &promoted), r);
    }
    if (violation->empty()) {
      // Re-sends go where promotions go: to the worker if the shard runs, else they wait for
      // the next one (restart_shard window, a dying worker being drained).
      promoted.insert(promoted.begin(), resend.begin(), resend.end());
      place_promoted(sh, promoted, &ended);
    } else {
      for (uint32_t idx : resend) sh.table[idx].place = SlotPlace::kSent;  // ended with the worker
      for (uint32_t idx : promoted) sh.table.park(idx);                    // run after the restart
    }
  }
  for (auto& [completion, r] : done) {
    Result res;
    res.status = static_cast<Status>(r.status);
    res.shard = sh.index;
    if (res.status == Status::ok) {
      if (!detail::decode_value(r.value, &res.value)) {
        res.status = Status::worker_lost;
        res.error = "its worker sent an invalid value";
        if (violation->empty()) *violation = "sent an invalid value";
      }
    } else {
      res.error = r.error;
    }
    deliver_from_loop(sh, std::move(completion), std::move(res));
  }
  done.clear();
  for (auto& [c, r] : ended) deliver_from_loop(sh, std::move(c), std::move(r));
  ended.clear();
}

// A dead worker's last words: results it wrote before it exited are still in the socket.
void Host::Impl::drain(WorkerProcess* w) {
  std::string violation;
  // Bounded only as a guard: a killed or exited process cannot keep writing.
  for (int i = 0; i < 100000 && violation.empty(); ++i) {
    if (w->reader().read_from(w->result_fd()) <= 0) break;
    process_frames(w, &violation);
  }
}

// The host decided this worker must go: record why (it decides the statuses), kill its group.
void Host::Impl::kill_worker(WorkerProcess* w, DeathCause cause, const std::string& why,
                             uint64_t overrun_id) {
  if (w->dead()) return;
  w->decide_kill(cause, overrun_id);
  worker_died(w, cause, why);
}

// First sign of a worker's death (exit, kill decision, end of stream + exit status): kill its
// group, drain what it wrote, end or retry what it was running, schedule the restart.
// Idempotent per worker.
void Host::Impl::worker_died(WorkerProcess* w, DeathCause cause, const std::string& why) {
  Shard& sh = w->shard();
  if (w->dead()) return;
  if (w->kill_cause()) cause = *w->kill_cause();  // the host's decision names it
  const bool stop = stopping.load();
  // Which evaluation was running (a crash's suspect), before anything else changes the page.
  uint64_t running = 0;
  int64_t since = 0;
  if (w->page()) protocol::read_running(*w->page(), &running, &since);
  w->mark_dead();
  {
    // Nothing more goes to this worker: what draining promotes or re-sends waits for the next.
    MutexLock lock(sh.mu);
    if (sh.writer) sh.writer->close();
    sh.writer.reset();
    set_state(sh, stop ? ShardState::kStopped : ShardState::kDown);
  }
  if (cause != DeathCause::kProtocol && w->reader().error() == protocol::FrameError::kNone)
    drain(w);
  w->close_io();
  uv_timer_stop(&sh.watchdog);

  const auto& exit = w->exit_status();
  const bool clean_exit = cause == DeathCause::kExit && exit && exit->clean();
  if (!stop && !clean_exit)
    log(LogLevel::warn, "outrun: shard {} worker {} {}", sh.index, w->pid(), why);
  sh.deaths.fetch_add(1, std::memory_order_relaxed);
  if (!clean_exit) sh.by_cause[static_cast<int>(cause)].fetch_add(1, std::memory_order_relaxed);
  {
    MutexLock lock(sh.stats_mu);
    sh.last_death = why;
    sh.stats_page.reset();
  }

  detail::Death death;
  death.cause = cause;
  death.exit_code = exit ? exit->code : 0;
  death.signal = exit ? exit->signal : 0;
  death.uptime = detail::Clock::now() - w->started_at();
  death.restart_requested = w->restart_requested();
  death.how = why;
  Ended ended;
  std::vector<uint32_t> promoted;
  {
    MutexLock lock(sh.mu);
    // Charged before anything ends: a script this quarantines has its other evaluations (the
    // retries and what waits) ended below instead of sent to the next worker.
    if (const detail::ScriptRecord* suspect =
            stop ? nullptr : crash_suspect(sh, *w, cause, running)) {
      charge_crash(sh, *suspect, *w);
      death.charged = true;
    }
    std::vector<uint32_t> retry;
    for (uint32_t idx : sh.table.take_sent()) {
      Slot& slot = sh.table[idx];
      detail::EvaluationFate fate =
          sh.policy.fate(death, stop, sh.table.id(idx), running, w->overrun_id(), slot.retries);
      if (fate.retry) {
        ++slot.retries;
        slot.place = SlotPlace::kWaiting;
        retry.push_back(idx);
      } else {
        sh.table.end(idx, Result{fate.status, {}, std::move(fate.error), sh.index}, &ended,
                     &promoted);
      }
    }
    end_quarantined(sh, &retry, &ended, &promoted);
    end_quarantined(sh, &sh.table.waiting(), &ended, &promoted);
    // Retries go first: they were submitted before anything that waits already.
    if (!retry.empty()) {
      sh.retried.fetch_add(retry.size(), std::memory_order_relaxed);
      std::vector<uint32_t>& waiting = sh.table.waiting();
      retry.insert(retry.end(), waiting.begin(), waiting.end());
      waiting.swap(retry);
    }
    if (stop) {
      for (uint32_t idx : sh.table.take_waiting())
        sh.table.end(idx,
                     Result{Status::cancelled, {}, "the host shut down before it ran", sh.index},
                     &ended, &promoted);
    }
    set_state(sh, stop ? ShardState::kStopped : ShardState::kDown);
    place_promoted(sh, promoted, &ended);
  }
  if (sh.worker == w) sh.worker = nullptr;
  sh.pid.store(0, std::memory_order_relaxed);
  sh.worker_started_ns.store(0, std::memory_order_relaxed);
  deliver_all(sh, ended);
  if (!w->greeted()) {
    MutexLock lock(start_mu);
    if (start_error.empty())
      start_error = "worker " + std::to_string(w->pid()) + " " + why + " before its hello";
    start_cv.notify_all();
  }
  if (!stop) after_death(sh, death);
}

}  // namespace outrun
