// A result's way back to its client (design/daemon.md "Scheduler", D-cork, D-turn): counted,
// corked until the end of the Host's run of callbacks or of the loop turn, written; its window
// given back to the Scheduler. And the loop turn's check phase that refills and flushes.
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
  s->sched_->refill_due();
  if (s->flush_deferred_) {
    s->flush_deferred_ = false;
    s->flush_corked();
  }
}

// The loop's prepare phase, right before it polls: until the check phase, what a run of the
// Host's callbacks corks is flushed there.
void Server::on_poll_prepare(uv_prepare_t* h) {
  loop_thread.assert_here();
  static_cast<Server*>(h->data)->in_poll_ = true;
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
  sched_->refill_due();  // nothing is left queued behind a closed check
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
    sched_->refill(run.shard, &d);
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
  sched_->refill(run.shard, &d);
}

void Server::init_scheduler() {
  sched_ = std::make_unique<Scheduler>(
      host_->shards(), cfg_.max_client_queued_bytes,
      [this](std::vector<Request> batch, std::shared_ptr<Run> run) {
        // One call for any size: only a Request carries encoded inputs (protocol 2).
        host_->evaluate_batch(std::move(batch),
                              [this, run = std::move(run)](std::size_t i, Result r) {
                                complete(*run, i, std::move(r));
                              });
      },
      [this](const std::shared_ptr<Conn>& c) { want_write(c); });
}

// The tags engine's evaluations go through the Scheduler's tags lane (D-tags-lane).
void Server::submit_tag_evaluation(Request rq, Callback done) {
  if (!rq.script.valid()) {  // the Host answers it, as it would have before
    host_->evaluate(rq.script, std::move(rq.inputs), std::move(done));
    return;
  }
  // Where the Host runs it now: a tag script in the slow lane takes the lane's window, not its
  // home shard's (D-slow-lane), as a client's evaluation does.
  const int s = host_->shard_of(rq.script);
  sched_->submit_lane(s, Queued{std::move(rq), nullptr, 0, now_us(), 0, std::move(done)});
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
  const uint64_t n = sched_->cancel(*c);
  if (n == 0) return;
  counters_.by_status[static_cast<int>(Status::cancelled)].fetch_add(n, std::memory_order_relaxed);
  c->inflight.fetch_sub(static_cast<uint32_t>(n), std::memory_order_relaxed);
  counters_.inflight.fetch_sub(n, std::memory_order_relaxed);
  spdlog::debug("client {}: {} queued evaluations cancelled", c->id, n);
}

}  // namespace outrun::daemon
