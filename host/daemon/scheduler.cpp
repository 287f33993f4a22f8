// The per-shard windows (design/daemon.md "Scheduler"): W from each shard's service time, filled
// from the clients in turn, kQuantum each; completions on the dispatchers; cancelling what a
// closed client left queued.
#include "scheduler.h"

#include <algorithm>

#include "conn.h"
#include "script_table.h"

namespace outrun::daemon {

Scheduler::Scheduler(int shards, std::size_t max_client_queued_bytes, Submit submit, Held held)
    : n_(shards),
      max_client_queued_bytes_(max_client_queued_bytes),
      submit_(std::move(submit)),
      held_(std::move(held)),
      shards_(std::make_unique<ShardSched[]>(static_cast<std::size_t>(shards))),
      lane_(std::make_shared<Conn>(nullptr, -1, 0)),
      admit_(static_cast<std::size_t>(shards)),
      due_(static_cast<std::size_t>(shards), 0) {
  for (int i = 0; i < n_; ++i) {
    ShardSched& sh = shards_[i];
    MutexLock lock(sh.mu);  // no other thread has it yet: for the analysis
    sh.window = kWindowMin;
    sh.service_us = kWindowTargetUs / kWindowMin;
  }
  lane_->sched = make_queues();
}

std::unique_ptr<ConnShard[]> Scheduler::make_queues() const {
  return std::make_unique<ConnShard[]>(static_cast<std::size_t>(n_));
}

bool Scheduler::over_budget(Conn& c) {
  const std::size_t q = c.writer.queued_bytes();
  uint64_t peak = queued_peak_bytes_.load(std::memory_order_relaxed);
  while (q > peak &&
         !queued_peak_bytes_.compare_exchange_weak(peak, q, std::memory_order_relaxed)) {
  }
  return q > max_client_queued_bytes_;
}

bool Scheduler::hold(Conn& c) {
  if (c.held.exchange(true)) return false;
  held_total_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Scheduler::resume(Conn& c) {
  c.held.store(false, std::memory_order_relaxed);
  for (int s = 0; s < n_; ++s) {
    bool any = false;
    {
      ShardSched& sh = shards_[s];
      MutexLock lock(sh.mu);
      ConnShard& cs = c.sched[s];
      if (!cs.in_ring && !cs.q.empty()) {
        cs.in_ring = true;
        sh.ring.push_back(&c);
      }
      any = cs.in_ring;
    }
    if (any) refill(s, nullptr);
  }
}

void Scheduler::queue_admitted(Conn& c) {
  const bool held = c.held.load(std::memory_order_relaxed);
  for (int s = 0; s < n_; ++s) {
    std::vector<Queued>& add = admit_[static_cast<std::size_t>(s)];
    if (add.empty()) continue;
    {
      ShardSched& sh = shards_[s];
      MutexLock lock(sh.mu);
      ConnShard& cs = c.sched[s];
      for (Queued& q : add) cs.q.push_back(std::move(q));
      sh.queued += add.size();
      if (!cs.in_ring && !held) {
        cs.in_ring = true;
        sh.ring.push_back(&c);
      }
    }
    add.clear();
    due_[static_cast<std::size_t>(s)] = 1;
    any_due_ = true;
  }
}

void Scheduler::refill_due() {
  if (!any_due_) return;
  any_due_ = false;
  for (std::size_t s = 0; s < due_.size(); ++s) {
    if (!due_[s]) continue;
    due_[s] = 0;
    refill(static_cast<int>(s), nullptr);
  }
}

// The tags engine's evaluations take their turns in the rings with the clients' (D-tags-lane):
// a wave of many tags is kQuantum of them per turn, as a client's deep backlog is.
void Scheduler::submit_lane(int s, Queued q) {
  {
    ShardSched& sh = shards_[s];
    MutexLock lock(sh.mu);
    ConnShard& cs = lane_->sched[s];
    cs.q.push_back(std::move(q));
    ++sh.queued;
    if (!cs.in_ring) {
      cs.in_ring = true;
      sh.ring.push_back(lane_.get());
    }
  }
  refill(s, nullptr);
}

// Fills shard `s`'s window from the clients in turn, up to kQuantum each per turn, and submits
// what it took as one Host call (one frame to the worker where the Host can). `done`: called
// for a completion, whose window accounting happens here under the same lock; the window is then
// refilled only once a quarter of it is free (or it is empty), so completions that arrive one at
// a time still submit in runs.
void Scheduler::refill(int s, const Done* done) {
  ShardSched& sh = shards_[s];
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
        if (hold(*c)) newly_held.push_back(c->shared_from_this());
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
  for (auto& c : newly_held) held_(c);  // the loop stops reading it and watches it drain
  if (batch.empty()) return;
  submit_(std::move(batch), std::move(run));
}

uint64_t Scheduler::cancel(Conn& c) {
  uint64_t n = 0;
  for (int s = 0; s < n_; ++s) {
    std::deque<Queued> gone;
    {
      ShardSched& sh = shards_[s];
      MutexLock lock(sh.mu);
      ConnShard& cs = c.sched[s];
      if (cs.in_ring) {
        sh.ring.erase(std::find(sh.ring.begin(), sh.ring.end(), &c));
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
  return n;
}

Scheduler::WindowStats Scheduler::window(int s) const {
  ShardSched& sh = shards_[s];
  MutexLock lock(sh.mu);
  return WindowStats{sh.window, sh.used,        sh.service_us,
                     sh.queued, sh.ring.size(), lane_->sched[s].q.size()};
}

}  // namespace outrun::daemon
