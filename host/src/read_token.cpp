// ReadToken: the read-token protocol of one shard (read_token.h, design/threading.md
// "Leader/follower").
#include "read_token.h"

#ifndef _WIN32
#include <sys/eventfd.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cassert>
#include <utility>

namespace outrun::detail {

#ifndef _WIN32
ReadToken::ReadToken() : kick_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

ReadToken::~ReadToken() {
  if (kick_fd_ >= 0) close(kick_fd_);
}

void ReadToken::kick() const {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(kick_fd_, &one, sizeof one);  // EAGAIN: already kicked
}

void ReadToken::clear_kick() const {
  uint64_t v;
  [[maybe_unused]] ssize_t k = read(kick_fd_, &v, sizeof v);
}
#else
// Windows: nobody leads (attach() below), so nobody polls a kick. libuv reads the result pipe
// with an overlapped read always pending on the loop's IOCP; a second reader of the same pipe
// would race it for the bytes (design/windows.md "The Host on Windows").
ReadToken::ReadToken() = default;
ReadToken::~ReadToken() = default;
void ReadToken::kick() const {}
void ReadToken::clear_kick() const {}
#endif

void ReadToken::attach(WorkerProcess* w) {
  MutexLock lock(mu_);
#ifndef _WIN32
  source_ = w;
#else
  (void)w;  // never a source for a leader: the loop reads (above)
#endif
  handoff_read_ = false;
  handoff_violation_.clear();
  loop_paused_.store(false);
  resume_asked_.store(false);
}

void ReadToken::drop_source(WorkerProcess* w) {
  MutexLock lock(mu_);
  if (source_ == w) source_ = nullptr;
}

bool ReadToken::loop_acquire(bool* pause, Handoff* left) {
  MutexLock lock(mu_);
  if (holder_ != Holder::kNone) {
    // A leader reads (the loop never holds the token here): the loop stops polling a
    // level-triggered fd it reads, until it gives the token up with evaluations still in flight.
    *pause = !loop_paused_.load();
    if (*pause) loop_paused_.store(true);
    return false;
  }
  set_holder(Holder::kLoop);
  left->read = std::exchange(handoff_read_, false);
  left->violation = std::exchange(handoff_violation_, {});
  token.acquire();
  return true;
}

bool ReadToken::loop_release(WorkerProcess* w, bool poison, bool in_flight) {
  token.release();
  MutexLock lock(mu_);
  if (poison && source_ == w) source_ = nullptr;
  if (hand_to_waiter()) return false;
  set_holder(Holder::kNone);
  if (loop_paused_.load() && in_flight) {
    loop_paused_.store(false);
    return true;
  }
  return false;
}

void ReadToken::take_for_death(WorkerProcess* w) {
  MutexLock lock(mu_);
  if (source_ == w) source_ = nullptr;  // nobody takes it for `w` again
  handoff_read_ = false;                // the death handles all of it
  handoff_violation_.clear();
  if (holder_ != Holder::kNone) {
    loop_wants_ = true;
    kick();
    loop_cv_.wait(mu_, [&]() REQUIRES(mu_) { return holder_ == Holder::kLoop; });
  } else {
    set_holder(Holder::kLoop);
  }
  token.acquire();
}

void ReadToken::release_after_death() {
  token.release();
  MutexLock lock(mu_);
  set_holder(Holder::kNone);
}

ReadToken::Attend ReadToken::loop_attend() {
  MutexLock lock(mu_);
  const bool handoff = handoff_read_ || !handoff_violation_.empty();
  const bool resume = resume_asked_.exchange(false);
  if (handoff) return Attend::kRead;  // its release polls again if evaluations are in flight
  if (resume && loop_paused_.load()) {
    loop_paused_.store(false);
    return Attend::kPoll;
  }
  return Attend::kNothing;
}

bool ReadToken::wait_to_lead(SyncWaiter& me, WorkerProcess** w) {
  assert(&me.rd_ == this);  // a waiter waits on its own shard's token
  MutexLock lock(mu_);
  me.rd_.mu_.assert_held();
  me.thread_ = std::this_thread::get_id();
  if (!me.has_token_) {
    if (me.done_) return false;
    if (holder_ == Holder::kNone && source_ && !loop_wants_ && !handoff_read_ &&
        handoff_violation_.empty()) {
      set_holder(Holder::kLeader);
      me.has_token_ = true;
    } else {
      // Someone reads (the loop, or a leader that will hand the token on), or the shard has no
      // readable worker (the loop reads the next one): wait for the result or the token.
      waiters_.push_back(&me);
      me.cv_.wait(mu_, [&]() REQUIRES(mu_) {
        me.rd_.mu_.assert_held();
        return me.done_ || me.has_token_;
      });
      std::erase(waiters_, &me);
      if (!me.has_token_) return false;
    }
  }
  *w = source_;  // null: it stopped being readable since the token was handed over
  token.acquire();
  return true;
}

bool ReadToken::leader_must_stop(SyncWaiter& me, const WorkerProcess* w) {
  assert(&me.rd_ == this);
  MutexLock lock(mu_);
  me.rd_.mu_.assert_held();
  return me.done_ || loop_wants_ || source_ != w;
}

bool ReadToken::leader_release(SyncWaiter& me, Handoff&& h, bool in_flight) {
  assert(&me.rd_ == this);
  token.release();
  MutexLock lock(mu_);
  me.rd_.mu_.assert_held();
  me.has_token_ = false;
  if (h.read) handoff_read_ = true;
  if (!h.violation.empty()) {
    handoff_violation_ = std::move(h.violation);
    source_ = nullptr;  // nobody reads a worker that violated the protocol again
  }
  if (loop_wants_) {
    loop_wants_ = false;
    set_holder(Holder::kLoop);
    loop_cv_.notify_one();
    return false;
  }
  if (handoff_read_ || !handoff_violation_.empty()) {
    set_holder(Holder::kNone);
    return true;  // the loop acts on it (on_wakeup -> attend_reading)
  }
  if (hand_to_waiter()) return false;
  set_holder(Holder::kNone);
  return loop_paused_.load() && in_flight && !resume_asked_.exchange(true);
}

bool ReadToken::hand_to_waiter() {
  if (!source_ || handoff_read_ || !handoff_violation_.empty()) return false;
  for (SyncWaiter* f : waiters_) {
    assert(&f->rd_ == this);
    f->rd_.mu_.assert_held();
    if (!f->done_ && !f->has_token_) {
      f->has_token_ = true;
      set_holder(Holder::kLeader);
      f->cv_.notify_one();
      return true;
    }
  }
  return false;
}

ReadToken::Holder ReadToken::holder() const {
  MutexLock lock(mu_);
  return holder_;
}

bool ReadToken::loop_wants() const {
  MutexLock lock(mu_);
  return loop_wants_;
}

std::size_t ReadToken::waiting() const {
  MutexLock lock(mu_);
  return waiters_.size();
}

void SyncWaiter::fulfil(Result&& r) {
  MutexLock lock(rd_.mu_);
  result_ = std::move(r);
  done_ = true;
  ready_.store(true, std::memory_order_release);
  if (std::this_thread::get_id() == thread_) return;  // the leader read its own result
  // Delivered by another thread (the loop at a death, a refusal, a coalesced replacement, a
  // leader): wake it, in its condition variable or, while it leads, in its poll.
  if (has_token_) rd_.kick();
  cv_.notify_one();
}

bool SyncWaiter::wait_until(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(rd_.mu_);
  return cv_.wait_until(rd_.mu_, deadline, [&]() REQUIRES(rd_.mu_) { return done_; });
}

Result SyncWaiter::take() {
  MutexLock lock(rd_.mu_);
  return std::move(result_);
}

// NO_THREAD_SAFETY_ANALYSIS: `ready_` was read (acquire) or `done_` under the mutex, and nothing
// writes the result again; the token (and its mutex) may be gone.
Result SyncWaiter::take_ready() NO_THREAD_SAFETY_ANALYSIS {
  return std::move(result_);
}

}  // namespace outrun::detail
