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

detail::SpawnSpec Host::Impl::worker_spec(int shard) const {
  detail::SpawnSpec spec;
  spec.path = worker_path;
  spec.shard = shard;
  spec.env = worker_env.empty() ? nullptr : const_cast<char**>(worker_env.data());
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
    set_state(sh, ShardState::kRunning);
    std::fill(sh.known.begin(), sh.known.end(), 0);
    std::vector<uint32_t> waiting = sh.table.take_waiting();
    if (!waiting.empty()) send_slots(sh, waiting);
  }
  arm_watchdog(sh, w->started_ns());
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
  const auto& x = *w->exit_status();
  worker_died(w, x.cause(), describe_exit(x.code, x.signal));
}

void Host::Impl::on_worker_readable(WorkerProcess* w) {
  loop_role.assert_here();
  loop_read(w->shard(), w);
}

void Host::Impl::loop_read(Shard& sh, WorkerProcess* w) {
  // What a leader left: a frame put back or an end of stream (`read`), a violation it found.
  detail::Handoff left;
  bool pause = false;
  if (!sh.reading.loop_acquire(&pause, &left)) {
    // A leader reads: stop polling a level-triggered fd it reads, until the token is given up
    // with evaluations still in flight.
    if (pause) w->pause_reading();
    return;
  }
  std::string violation = std::move(left.violation);
  bool ended = false;
  if (violation.empty() && left.read) process_frames(sh, w, &violation);
  if (violation.empty()) {
    const long n = w->reader().read_from(w->result_fd());
    if (n > 0) {
      sh.reads.fetch_add(1, std::memory_order_relaxed);
      process_frames(sh, w, &violation);
    } else if (n != -EAGAIN) {
      ended = true;  // EOF or ECONNRESET: what it wrote before is drained in worker_died
    }
  }
  loop_release(sh, w, ended || !violation.empty());
  if (ended)
    stream_ended(w);
  else if (!violation.empty())
    kill_worker(w, DeathCause::kProtocol, "violated the protocol: " + violation);
}

void Host::Impl::loop_release(Shard& sh, WorkerProcess* w, bool poison) {
  MutexLock lock(sh.mu);  // in_use() and the release together (ReadToken: lock order)
  if (sh.reading.loop_release(w, poison, sh.table.in_use() > 0)) w->resume_reading();
}

void Host::Impl::attend_reading(Shard& sh) {
  on_loop(sh);
  WorkerProcess* w = sh.worker;
  if (!w ||
      (w->life() != WorkerProcess::Life::kStarting && w->life() != WorkerProcess::Life::kServing))
    return;
  switch (sh.reading.loop_attend()) {
    case detail::ReadToken::Attend::kRead:
      loop_read(sh, w);  // its release polls again if evaluations are in flight
      return;
    case detail::ReadToken::Attend::kPoll:
      w->resume_reading();
      return;
    case detail::ReadToken::Attend::kNothing:
      return;
  }
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
void Host::Impl::process_frames(Shard& sh, WorkerProcess* w, std::string* violation) {
  on_loop(sh);
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
          handle_results(sh, w, std::get<protocol::ResultsMsg>(m).items, violation,
                         &sh.to_dispatch);
        break;
      default:
        break;  // decode_worker_frame took it for a violation
    }
  }
  if (violation->empty() && w->reader().error() != protocol::FrameError::kNone)
    *violation = protocol::to_string(w->reader().error());
  if (!sh.to_dispatch.empty()) sh.dispatcher->post(sh.to_dispatch);
  end_loop_callbacks();
}

void Host::Impl::handle_results(Shard& sh, WorkerProcess*,
                                const flatbuffers::Vector<flatbuffers::Offset<wire::Result>>* items,
                                std::string* violation,
                                std::vector<detail::Delivery>* to_dispatch) {
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
      const Slot* found = sh.table.sent(id);
      if (!found) {
        *violation = "answered an evaluation it was not running (id " + std::to_string(id) + ")";
        break;
      }
      const Slot& slot = *found;
      protocol::ResultView r;
      if (!protocol::decode_worker_result(item, &r, violation)) break;
      if (r.status == wire::Status::NeedSource) {
        // The worker does not hold the script (dropped for its budget, or never sent), or the
        // bytecode it was sent did not load: the script follows (as bytecode when the host has
        // it and it did not fail), as often as the slot's SourceState allows.
        if (!sh.table.need_source(idx)) {
          *violation = "asked twice for the source of evaluation " + std::to_string(id);
          break;
        }
        const uint32_t sid = detail::record_of(slot.script)->id;
        if (sid < sh.known.size()) sh.known[sid] = 0;
        resend.push_back(idx);
        continue;
      }
      // The slow lane (D-slow-lane): a timeout moves the script there; in the lane, one that
      // behaved counts towards its way back. One compare of a status already decoded elsewhere.
      if (r.status == wire::Status::Timeout) [[unlikely]]
        misbehaved(*detail::record_of(slot.script));
      else if (sh.index == lane) [[unlikely]]
        behaved_in_lane(*detail::record_of(slot.script));
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
      for (uint32_t idx : resend) sh.table.keep_with_worker(idx);  // settled with its death
      for (uint32_t idx : promoted) sh.table.park(idx);            // run after the restart
    }
  }
  // What this frame's values and messages may decode to, a shared part counted per use
  // (D-result-budget). Once it is spent, the frame's other results end worker_lost and the
  // worker is killed for the violation.
  std::size_t budget = detail::kMaxResultsDecodeBytes;
  const auto lost = [&](Result& res, bool spent) {
    res.value = Value{};
    res.status = Status::worker_lost;
    res.error = spent ? "its worker sent results past the decode budget (more than " +
                            std::to_string(detail::kMaxResultsDecodeBytes) + " bytes in one frame)"
                      : "its worker sent an invalid value";
    if (violation->empty())
      *violation = spent ? "sent results past the decode budget" : "sent an invalid value";
  };
  for (auto& [completion, r] : done) {
    Result res;
    res.status = static_cast<Status>(r.status);
    res.shard = sh.index;
    const detail::ResultDecode d = detail::decode_result(res.status == Status::ok, r.value, r.error,
                                                         &res.value, &res.error, &budget);
    if (d != detail::ResultDecode::ok) lost(res, d == detail::ResultDecode::spent);
    if (r.logs || r.logs_dropped) [[unlikely]] {  // the script printed or logged
      res.logs_dropped = r.logs_dropped;
      detail::decode_logs(r.logs, &res.logs, &res.logs_dropped, &budget);
    }
    deliver_read(std::move(completion), std::move(res), to_dispatch);
  }
  done.clear();
  for (auto& [c, r] : ended) deliver_read(std::move(c), std::move(r), to_dispatch);
  ended.clear();
}

// A dead worker's last words: results it wrote before it exited are still in the socket.
void Host::Impl::drain(Shard& sh, WorkerProcess* w) {
  std::string violation;
  // What a leader put back comes first.
  process_frames(sh, w, &violation);
  // Bounded only as a guard: a killed or exited process cannot keep writing.
  for (int i = 0; i < 100000 && violation.empty(); ++i) {
    if (w->reader().read_from(w->result_fd()) <= 0) break;
    sh.reads.fetch_add(1, std::memory_order_relaxed);
    process_frames(sh, w, &violation);
  }
}

// The host decided this worker must go: record why (it decides the statuses), kill its group.
void Host::Impl::kill_worker(WorkerProcess* w, DeathCause cause, const std::string& why,
                             uint64_t overrun_id) {
  if (w->dead()) return;
  w->decide_kill(cause, overrun_id);
  worker_died(w, cause, why);
}

// First sign of a worker's death (exit, kill decision, end of stream + exit status). Idempotent
// per worker. It only sequences what each owner does (design/supervision.md "Who does what in a
// death"): the worker builds its Death record and is killed; the shard stops sending to it; what
// it wrote is drained; the slot table settles what it had been sent (retried or ended, as the
// restart policy says); the restart decision is applied, once.
void Host::Impl::worker_died(WorkerProcess* w, DeathCause cause, const std::string& why) {
  Shard& sh = w->shard();
  on_loop(sh);
  if (w->dead()) return;
  const bool stop = stopping.load();
  // The worker: its Death record (the host's kill decision names the cause; the evaluation it
  // was running is read before anything else changes the page), then SIGKILL to its group.
  detail::Death death = w->death(cause, why, detail::Clock::now());
  w->mark_dead();
  {
    // The shard: nothing more goes to this worker; what draining promotes or re-sends waits for
    // the next one.
    MutexLock lock(sh.mu);
    if (sh.writer) sh.writer->close();
    sh.writer.reset();
    set_state(sh, stop ? ShardState::kStopped : ShardState::kDown);
  }
  // Its last words. Its socket and reader are the loop's from here: a leader that reads them is
  // stopped first.
  sh.reading.take_for_death(w);
  if (death.cause != DeathCause::kProtocol && w->reader().error() == protocol::FrameError::kNone)
    drain(sh, w);
  w->close_io();
  sh.reading.release_after_death();  // nobody reads `w` again
  uv_timer_stop(&sh.watchdog);

  record_death(sh, *w, death, stop);
  Ended ended;
  {
    MutexLock lock(sh.mu);
    settle_death(sh, *w, &death, stop, &ended);
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

// The log line, the shard's counters and its last death.
void Host::Impl::record_death(Shard& sh, const WorkerProcess& w, const detail::Death& death,
                              bool stop) {
  const auto& exit = w.exit_status();
  const bool clean_exit = death.cause == DeathCause::kExit && exit && exit->clean();
  if (!stop && !clean_exit)
    log(LogLevel::warn, "outrun: shard {} worker {} {}", sh.index, w.pid(), death.how);
  sh.deaths.fetch_add(1, std::memory_order_relaxed);
  if (!clean_exit)
    sh.by_cause[static_cast<int>(death.cause)].fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(sh.stats_mu);
  sh.last_death = death.how;
  sh.stats_page.reset();
}

// What the dead worker had been sent: the crash is charged first (to a script, if one explains
// it: then `death->charged`), then the slot table settles each evaluation as the restart policy
// says (RestartPolicy::fate): retried (ahead of what waits) or ended. Quarantined scripts' end.
void Host::Impl::settle_death(Shard& sh, const WorkerProcess& w, detail::Death* death, bool stop,
                              Ended* ended) {
  std::vector<uint32_t> promoted;
  // Charged before anything ends: a script this quarantines has its other evaluations (the
  // retries and what waits) ended below instead of sent to the next worker.
  const detail::ScriptRecord* suspect =
      stop ? nullptr : crash_suspect(sh, w, death->cause, death->running);
  if (suspect) {
    charge_crash(sh, *suspect, w);
    death->charged = true;
    misbehaved(*suspect);  // the slow lane, while (or once) it is not quarantined
  }
  // The evaluation the death is charged to (Result::killed_worker): the crash's suspect, or the
  // one that overran; 0: none (evaluation ids start at 1).
  const uint64_t killer = stop                                   ? 0
                          : suspect                              ? death->running
                          : death->cause == DeathCause::kOverrun ? death->overrun_id
                                                                 : 0;
  const detail::Death& d = *death;
  on_loop(sh);
  // The lambda runs here, on the loop thread, under sh.mu (the analysis does not carry the
  // loop's role into a lambda: it gets the policy's address, taken where the role is held).
  const detail::RestartPolicy* policy = &sh.policy;
  const int shard = sh.index;
  std::vector<uint32_t> retry = sh.table.settle(
      [&](uint64_t id, const Slot& slot) -> std::optional<Result> {
        detail::EvaluationFate fate =
            policy->fate(d, stop, id, d.running, d.overrun_id, slot.retries);
        if (fate.retry) return std::nullopt;
        if (fate.status == Status::killed)
          misbehaved(*detail::record_of(slot.script));  // overran T+G
        Result r{fate.status, {}, std::move(fate.error), shard};
        r.killed_worker = killer != 0 && id == killer;
        return r;
      },
      ended, &promoted);
  end_quarantined(sh, &retry, ended, &promoted);
  end_quarantined_waiting(sh, ended, &promoted);
  if (!retry.empty()) sh.retried.fetch_add(retry.size(), std::memory_order_relaxed);
  sh.table.requeue_retries(retry);
  if (stop)
    sh.table.end_waiting(Result{Status::cancelled, {}, "the host shut down before it ran", shard},
                         ended, &promoted);
  place_promoted(sh, promoted, ended);
}

}  // namespace outrun
