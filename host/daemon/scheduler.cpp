// The per-shard windows (design/daemon.md "Scheduler"): W from each shard's service time, filled
// from the clients in turn, kQuantum each; completions on the dispatchers; cancelling what a
// closed client left queued.
#include "scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "conn.h"
#include "server.h"

namespace outrun::daemon {

// The loop's check phase, right after it handled what one poll returned (every client's reads of
// this turn): what their frames queued goes to the Host now, one Host call (one frame, one send
// to the worker) per shard for all of them, not one per Evaluate frame or per client. Then the
// results the turn's reads from the workers corked go to their clients (corked_run_ended).
void Server::on_refill_check(uv_check_t* h) {
  loop_thread.assert_here();
  auto* s = static_cast<Server*>(h->data);
  s->in_poll_ = false;
  s->refill_due();
  if (s->flush_deferred_) {
    s->flush_deferred_ = false;
    s->flush_corked();
  }
}

// The loop's prepare phase, right before it polls: until the check phase, what a run of the
// Host's callbacks corks is flushed there.
void Server::on_poll_prepare(uv_prepare_t* h) {
  static_cast<Server*>(h->data)->in_poll_ = true;
}

void Server::refill_due() {
  if (!refill_due_.any) return;
  refill_due_.any = false;
  for (std::size_t s = 0; s < refill_due_.shards.size(); ++s) {
    if (!refill_due_.shards[s]) continue;
    refill_due_.shards[s] = 0;
    refill(static_cast<int>(s), nullptr);
  }
}

void Server::start_refill_check() {
  uv_check_init(loop_, &refill_check_);
  refill_check_.data = this;
  uv_check_start(&refill_check_, &Server::on_refill_check);
  uv_prepare_init(loop_, &poll_prepare_);
  poll_prepare_.data = this;
  uv_prepare_start(&poll_prepare_, &Server::on_poll_prepare);
}

void Server::close_refill_check() {
  refill_due();  // nothing is left queued behind a closed check
  uv_check_stop(&refill_check_);
  uv_close(reinterpret_cast<uv_handle_t*>(&refill_check_), nullptr);
  uv_prepare_stop(&poll_prepare_);
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_prepare_), nullptr);
  in_poll_ = false;  // from here on a run's results are written when it ends
  if (flush_deferred_) {
    flush_deferred_ = false;
    flush_corked();
  }
}

void Server::init_scheduler() {
  const int n = host_->shards();
  sched_ = std::make_unique<ShardSched[]>(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    ShardSched& sh = sched_[i];
    MutexLock lock(sh.mu);  // no other thread has it yet: for the analysis
    sh.window = kWindowMin;
    sh.service_us = kWindowTargetUs / kWindowMin;
  }
  admit_.resize(static_cast<std::size_t>(n));
  refill_due_.shards.assign(static_cast<std::size_t>(n), 0);
  // The tags lane: never read, never written to, never held (nothing is queued to its writer).
  tags_lane_ = std::make_shared<Conn>(this, -1, 0);
  tags_lane_->sched = std::make_unique<ConnShard[]>(static_cast<std::size_t>(n));
}

// The tags engine's evaluations take their turns in the rings with the clients' (D-tags-lane):
// a wave of many tags is kQuantum of them per turn, as a client's deep backlog is.
void Server::submit_tag_evaluation(Request rq, Callback done) {
  if (!rq.script.valid()) {  // the Host answers it, as it would have before
    host_->evaluate(rq.script, std::move(rq.inputs), std::move(done));
    return;
  }
  // Where the Host runs it now: a tag script in the slow lane takes the lane's window, not its
  // home shard's (D-slow-lane), as a client's evaluation does.
  const int s = host_->shard_of(rq.script);
  {
    ShardSched& sh = sched_[s];
    MutexLock lock(sh.mu);
    ConnShard& cs = tags_lane_->sched[s];
    cs.q.push_back(Queued{std::move(rq), nullptr, 0, now_us(), 0, std::move(done)});
    ++sh.queued;
    if (!cs.in_ring) {
      cs.in_ring = true;
      sh.ring.push_back(tags_lane_.get());
    }
  }
  refill(s, nullptr);
}

namespace {
// Statuses of evaluations a worker ran: only their durations say how long one takes.
bool ran_in_worker(Status s) {
  switch (s) {
    case Status::ok:
    case Status::compile_error:
    case Status::runtime_error:
    case Status::timeout:
    case Status::killed:
    case Status::memory_limit:
      return true;
    default:
      return false;
  }
}
}  // namespace

// Fills shard `s`'s window from the clients in turn, up to kQuantum each per turn, and submits
// what it took as one Host call (one frame to the worker where the Host can). `done`: called
// for a completion, whose window accounting happens here under the same lock; the window is then
// refilled only once a quarter of it is free (or it is empty), so completions that arrive one at
// a time still submit in runs.
void Server::refill(int s, const Done* done) {
  ShardSched& sh = sched_[s];
  std::shared_ptr<Run> run;
  std::vector<Request> batch;
  std::vector<std::shared_ptr<Conn>> newly_held;  // allocates only when one is
  {
    MutexLock lock(sh.mu);
    if (done) {
      --sh.used;
      if (done->ran) {
        // A worker runs its evaluations in order: this one started when it was sent or when the
        // previous one ended, whichever was later.
        const uint64_t began = std::max(done->sent_us, sh.last_done_us);
        const double sample =
            done->now_us > began ? static_cast<double>(done->now_us - began) : 0.0;
        sh.service_us += (sample - sh.service_us) / 8;
        const double w = kWindowTargetUs / std::max(sh.service_us, 1.0);
        sh.window = static_cast<uint32_t>(
            std::clamp(w, static_cast<double>(kWindowMin), static_cast<double>(kWindowMax)));
      }
      sh.last_done_us = std::max(sh.last_done_us, done->now_us);
      if (sh.used > 0 &&
          (sh.used >= sh.window || sh.window - sh.used < std::max<uint32_t>(1, sh.window / 4)))
        return;
    }
    if (sh.ring.empty() || sh.used >= sh.window) return;
    while (sh.used < sh.window && !sh.ring.empty()) {
      Conn* c = sh.ring.front();
      sh.ring.pop_front();
      ConnShard& cs = c->sched[s];
      if (c->held.load(std::memory_order_relaxed) || over_budget(*c)) {
        cs.in_ring = false;  // the loop puts it back when it resumes
        if (!c->held.exchange(true)) {
          held_total_.fetch_add(1, std::memory_order_relaxed);
          newly_held.push_back(c->shared_from_this());
        }
        continue;
      }
      if (!run) {
        run = std::make_shared<Run>();
        run->shard = s;
        // At most this fill's room and what is queued: no reallocation while it fills.
        const std::size_t most = std::min<std::size_t>(sh.window - sh.used, sh.queued);
        run->items.reserve(most);
        batch.reserve(most);
      }
      run->conns.push_back(c->shared_from_this());
      for (uint32_t k = 0; k < kQuantum && sh.used < sh.window && !cs.q.empty(); ++k) {
        Queued& q = cs.q.front();
        batch.push_back(std::move(q.rq));
        run->items.push_back(RunItem{c, std::move(q.entry), q.id, q.t0, q.uid, std::move(q.done)});
        cs.q.pop_front();
        ++sh.used;
        --sh.queued;
      }
      if (cs.q.empty())
        cs.in_ring = false;
      else
        sh.ring.push_back(c);
    }
    if (run) run->sent_us = now_us();
  }
  for (auto& c : newly_held) want_write(c);  // the loop stops reading it and watches it drain
  if (batch.empty()) return;
  // One call for any size: only a Request carries encoded inputs (protocol 2).
  host_->evaluate_batch(std::move(batch),
                        [this, run](std::size_t i, Result r) { complete(*run, i, std::move(r)); });
}

// A result: on the Host's loop thread (host.callbacks_on_loop, the default) or the dispatcher
// thread of its shard.
void Server::complete(Run& run, std::size_t i, Result&& r) {
  RunItem& it = run.items[i];
  if (it.done) {
    // The tags lane's: the window's accounting first, so that what the callback submits next
    // (a wave's next tags) finds the room this one left.
    const uint64_t now = now_us();
    const Done d{run.sent_us, now, ran_in_worker(r.status)};
    Callback done = std::move(it.done);
    refill(run.shard, &d);
    done(std::move(r));
    return;
  }
  Conn& c = *it.conn;
  const bool cork = cfg_.host.after_loop_callbacks && host_->on_loop_thread();
  uint64_t now;
  if (cork) {
    if (run_now_us_ == 0) run_now_us_ = now_us();
    now = run_now_us_;
  } else {
    now = now_us();
  }
  const uint64_t us = now - std::min(now, it.t0);
  counters_.latency.record(us);
  counters_.shard_latency[run.shard].record(us);
  if (r.killed_worker) charge_crash(it.uid, now);
  const int st = static_cast<int>(r.status);
  counters_.by_status[st].fetch_add(1, std::memory_order_relaxed);
  it.entry->by_status[st].fetch_add(1, std::memory_order_relaxed);
  if (!r.logs.empty() || r.logs_dropped != 0) [[unlikely]]
    record_script_logs(*it.entry, r);
  // Released before the result is written: a client that sends its next evaluation as soon as
  // this one's result arrives is never counted over its limit (and answered busy).
  c.inflight.fetch_sub(1, std::memory_order_relaxed);
  const bool ran = ran_in_worker(r.status);
  if (cork) {
    // Corked until this loop turn's check phase (flush_corked): one frame and one send per
    // client per turn, however many of its results the turn read from however many shards. The
    // daemon's in-flight count, which the drain waits on, goes down once it is written.
    if (c.corked.empty()) corked_.push_back(c.shared_from_this());
    c.corked.emplace_back(it.id, std::move(r));
  } else {
    counters_.inflight.fetch_sub(1, std::memory_order_relaxed);
    send_result(c, it.id, r);
    check_hard_limit(c.shared_from_this());
  }
  const Done d{run.sent_us, now, ran};
  refill(run.shard, &d);
}

void Server::record_script_logs(ScriptEntry& e, const Result& r) {
  const int64_t unix_us = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  e.logs.append(r.logs, r.logs_dropped, unix_us, &script_log_budget_);
  if (!spdlog::should_log(spdlog::level::debug)) return;
  for (const LogLine& l : r.logs)
    spdlog::debug("script '{}': {}: {}", e.key, detail::script_level_name(l.level), l.text);
}

void Server::charge_crash(uint32_t uid, uint64_t now) {
  if (!crash_budget_.charge(uid, CrashBudget::Clock::time_point(std::chrono::microseconds(now))))
    return;
  const CrashBudget::Limits& l = crash_budget_.limits();
  spdlog::warn(
      "uid {}: its evaluations crashed workers {} times within {} ms (daemon.max_crashes_per_uid, "
      "crash_window_ms): its evaluations and new scripts are refused for {} ms "
      "(daemon.crash_cooldown_ms)",
      uid, l.max_crashes, l.window.count(), l.cooldown.count());
}

void Server::destroy_host() {
  delete host_.get();
  (void)host_.release();
}

void Server::corked_run_ended() {
  run_now_us_ = 0;
  if (corked_.empty()) return;
  if (in_poll_)
    flush_deferred_ = true;  // this turn's check phase writes them, with the turn's other reads
  else
    flush_corked();  // a timer's or a closing handle's run: no check phase before the next poll
}

void Server::flush_corked() {
  run_now_us_ = 0;
  for (const std::shared_ptr<Conn>& c : corked_) {
    send_results(*c, c->corked);
    counters_.inflight.fetch_sub(c->corked.size(), std::memory_order_relaxed);
    if (c->corked.capacity() > 1024)
      c->corked = {};  // a burst's list is not kept for the connection's life
    else
      c->corked.clear();
    check_hard_limit(c);
  }
  corked_.clear();
}

// Results of what is in the window still arrive while the client is held; past the hard limit
// (a few huge results), the loop disconnects it.
void Server::check_hard_limit(const std::shared_ptr<Conn>& c) {
  if (c->writer.queued_bytes() > kHardLimitFactor * cfg_.max_client_queued_bytes &&
      !c->over_limit.exchange(true))
    want_write(c);
}

// Loop thread, when the connection closes: what it still has queued in the daemon ends
// `cancelled` at once (counted; nobody receives it) and is freed; what is in the Host finishes.
void Server::cancel_queued(Conn* c) {
  c->paused_frame = nullptr;
  if (!c->sched) return;
  uint64_t n = 0;
  for (int s = 0; s < counters_.shards; ++s) {
    std::deque<Queued> gone;
    {
      ShardSched& sh = sched_[s];
      MutexLock lock(sh.mu);
      ConnShard& cs = c->sched[s];
      if (cs.in_ring) {
        sh.ring.erase(std::find(sh.ring.begin(), sh.ring.end(), c));
        cs.in_ring = false;
      }
      gone.swap(cs.q);
      sh.queued -= gone.size();
    }
    for (const Queued& q : gone)
      q.entry->by_status[static_cast<int>(Status::cancelled)].fetch_add(1,
                                                                        std::memory_order_relaxed);
    n += gone.size();
  }
  if (n == 0) return;
  counters_.by_status[static_cast<int>(Status::cancelled)].fetch_add(n, std::memory_order_relaxed);
  c->inflight.fetch_sub(static_cast<uint32_t>(n), std::memory_order_relaxed);
  counters_.inflight.fetch_sub(n, std::memory_order_relaxed);
  spdlog::debug("client {}: {} queued evaluations cancelled", c->id, n);
}

}  // namespace outrun::daemon
