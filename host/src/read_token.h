// The read token of one shard (design/threading.md "Leader/follower"): who reads the current
// worker's result socket and its FrameReader. At most one holder at a time: the loop thread while
// it reads, or one caller waiting for its result (the leader), which reads until its own result
// is in and then hands the token to the loop when it asked, to another waiting caller, or to
// nobody. Like LevelDB's writer queue, one class and one mutex own the protocol: every change of
// holder, source, queue and hand-off is one of the operations below, made under `mu_`.
//
// Who calls what:
//  - the loop thread: attach, drop_source, loop_acquire, loop_release, take_for_death,
//    release_after_death, loop_attend, loop_paused;
//  - a waiting caller: wait_to_lead, then (while it leads) leader_must_stop, kick_fd, clear_kick,
//    and leader_release;
//  - a submitter (under Shard::mu): submitter_must_resume, submitter_would_resume;
//  - whoever reads a result (the loop, a leader, a death): SyncWaiter::fulfil.
// loop_release and leader_release are called under Shard::mu (lock order Shard::mu -> mu_), so a
// submitter that reads `held` under Shard::mu never misses a change to "nobody".
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "outrun/runner.h"
#include "outrun/thread_annotations.h"

namespace outrun::detail {

class WorkerProcess;
struct SyncWaiter;

// What a leader leaves to the loop: read again (a frame put back in the reader, an end of stream,
// a read error), or a protocol violation it found.
struct Handoff {
  bool read = false;
  std::string violation;
};

class ReadToken {
 public:
  enum class Holder : uint8_t { kNone, kLoop, kLeader };

  ReadToken();   // the kick eventfd
  ~ReadToken();  // closes it
  ReadToken(const ReadToken&) = delete;
  ReadToken& operator=(const ReadToken&) = delete;

  // The capability: the source's FrameReader and result fd. Acquired by the operations that make
  // their caller the holder (loop_acquire, take_for_death, wait_to_lead), released by those that
  // give it up (loop_release, release_after_death, leader_release).
  Baton token;

  // ---- The loop thread.

  // A new worker: leaders may read it from now on; its poll runs (nothing paused, nothing handed
  // over, no resume asked).
  void attach(WorkerProcess* w) EXCLUDES(mu_);
  // Nobody takes the token for `w` again (its stream ended).
  void drop_source(WorkerProcess* w) EXCLUDES(mu_);
  // The loop's read of a readable result socket. True: the loop holds the token, and `left` is
  // what a leader left it (read what is buffered first; a violation to act on). False: a leader
  // holds it; `*pause` says the loop must stop polling now (the first time only: sticky until a
  // release or loop_attend says to poll again).
  bool loop_acquire(bool* pause, Handoff* left) TRY_ACQUIRE(true, token) EXCLUDES(mu_);
  // The loop gives the token up: to the first waiting caller whose result is not in, else to
  // nobody. `poison`: `w` stops being the source. `in_flight`: evaluations are in use (read under
  // Shard::mu, which the caller holds). True: the loop had stopped polling and must poll again.
  bool loop_release(WorkerProcess* w, bool poison, bool in_flight) RELEASE(token) EXCLUDES(mu_);
  // Before a death is handled: `w` stops being the source, anything handed over is dropped (the
  // death handles it all), and the token is the loop's, from whoever holds it: a leader is
  // kicked and hands it over within one batch (the loop blocks until then).
  void take_for_death(WorkerProcess* w) ACQUIRE(token) EXCLUDES(mu_);
  // After the death's drain and close: the token goes to nobody (nobody reads that worker again;
  // the next worker is read by the loop first).
  void release_after_death() RELEASE(token) EXCLUDES(mu_);
  // What the loop does when woken (on_wakeup): read (a leader handed a read or a violation
  // over), poll again (a leader or a submitter asked, and it had stopped), or nothing.
  enum class Attend : uint8_t { kNothing, kRead, kPoll };
  Attend loop_attend() EXCLUDES(mu_);
  // The loop stopped polling the result socket because a leader held the token.
  bool loop_paused() const { return loop_paused_.load(); }

  // ---- Submitters, under Shard::mu, after they sent an evaluation.

  // The loop does not poll, nobody holds the token and nobody asked yet: the caller (claiming the
  // ask, once) must wake the loop to poll. A holder sees the evaluation in use when it releases.
  // (Inline: every submission asks.)
  bool submitter_must_resume() {
    return loop_paused_.load() && !held_.load(std::memory_order_relaxed) &&
           !resume_asked_.exchange(true);
  }
  // What submitter_must_resume would answer, without claiming the ask.
  bool submitter_would_resume() const {
    return loop_paused_.load() && !held_.load(std::memory_order_relaxed) && !resume_asked_.load();
  }

  // ---- A caller waiting for its result (`me`, a waiter of this token).

  // Leads when nobody holds the token, a worker is readable, the loop does not want it and
  // nothing is handed over; else queues and sleeps until its result is in or the token is handed
  // to it. False: its result is in (no token). True: it holds the token and `*w` is the worker to
  // read (null: it stopped being readable since the hand-over; release at once).
  bool wait_to_lead(SyncWaiter& me, WorkerProcess** w) TRY_ACQUIRE(true, token) EXCLUDES(mu_);
  // A leader checks before each read: its result is in, the loop wants the token, or `w` is no
  // longer the source.
  bool leader_must_stop(SyncWaiter& me, const WorkerProcess* w) EXCLUDES(mu_);
  // An eventfd the leader polls next to the result socket: written to stop it (the loop wants
  // the token, or its own result was delivered by another thread). clear_kick() drains it.
  int kick_fd() const { return kick_fd_; }
  void clear_kick() const;
  // The leader gives the token up, leaving `h` to the loop: to the loop if it waits for it; else,
  // with a hand-off, to nobody; else to the first waiting caller whose result is not in; else to
  // nobody. `in_flight` as for loop_release (the caller holds Shard::mu). True: the loop must be
  // woken (a hand-off, or it had stopped polling with evaluations in use: asked once).
  bool leader_release(SyncWaiter& me, Handoff&& h, bool in_flight) RELEASE(token) EXCLUDES(mu_);

  // ---- Observers (statistics, tests).
  Holder holder() const EXCLUDES(mu_);
  // holder() != kNone, readable without the mutex (relaxed).
  bool held() const { return held_.load(std::memory_order_relaxed); }
  bool loop_wants() const EXCLUDES(mu_);
  std::size_t waiting() const EXCLUDES(mu_);  // callers queued for the token

 private:
  friend struct SyncWaiter;

  void set_holder(Holder h) REQUIRES(mu_) {
    holder_ = h;
    held_.store(h != Holder::kNone, std::memory_order_relaxed);
  }
  // To the first queued waiter that is not done; false: none (or nothing to read).
  bool hand_to_waiter() REQUIRES(mu_);
  void kick() const;

  // Guards every member below but the atomics, and every SyncWaiter of this token.
  mutable Mutex mu_;
  Holder holder_ GUARDED_BY(mu_) = Holder::kNone;
  // holder_ != kNone, readable without mu_: a submitter reads it under Shard::mu, which every
  // change to kNone by a release is made under too, so it never misses a release.
  std::atomic<bool> held_{false};
  // The worker a leader may read: set when it is spawned, cleared (so nobody takes the token for
  // it again) when its stream ended, a violation was found, or its death is handled.
  WorkerProcess* source_ GUARDED_BY(mu_) = nullptr;
  // Callers waiting for their result that would lead if handed the token, in arrival order.
  std::vector<SyncWaiter*> waiters_ GUARDED_BY(mu_);
  // The loop waits for the token (a death to handle): the holder hands it to the loop first.
  bool loop_wants_ GUARDED_BY(mu_) = false;
  CondVar loop_cv_;  // holder_ became kLoop for a loop that wants it
  // What a leader left to the loop (Handoff).
  bool handoff_read_ GUARDED_BY(mu_) = false;
  std::string handoff_violation_ GUARDED_BY(mu_);
  // The loop stopped polling the result socket because a leader held the token (written by the
  // loop under mu_; read by submitters under Shard::mu), and a wake-up to resume it is on its
  // way (claimed by one exchange).
  std::atomic<bool> loop_paused_{false};
  std::atomic<bool> resume_asked_{false};
  int kick_fd_ = -1;
};

// A caller waiting for one result: in evaluate_sync (on its stack), or on a Host's future
// (HostFuture, host_impl.h). Its state is guarded by its token's mutex, so a deliverer wakes it
// (under that mutex) before the caller can return. One thread waits on it at a time.
struct SyncWaiter {
  explicit SyncWaiter(ReadToken& r) : rd_(r) {}
  SyncWaiter(const SyncWaiter&) = delete;
  SyncWaiter& operator=(const SyncWaiter&) = delete;

  ReadToken& token() const { return rd_; }
  // Hands `r` to the waiter and wakes it (its condition variable, or its poll while it leads).
  // Runs no caller code. The waiter's own thread delivering to itself (a leader that read its
  // result) wakes nobody.
  void fulfil(Result&& r) EXCLUDES(rd_.mu_);
  // The result is in (acquire): `result` may be taken.
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  // A timed wait, which never leads: for whoever reads the result (the loop, a leader). False:
  // the deadline passed first.
  bool wait_until(std::chrono::steady_clock::time_point deadline) EXCLUDES(rd_.mu_);
  // After wait_to_lead returned false: the result, under the token's mutex.
  Result take() EXCLUDES(rd_.mu_);
  // After ready() was true or wait_until() returned true: the result, without the token's mutex
  // (the token may be gone: a future asked after its host).
  Result take_ready();

 private:
  friend class ReadToken;
  ReadToken& rd_;
  // The thread in wait_to_lead (none before it, and none for a timed wait on a future): a result
  // that thread read itself wakes nobody.
  std::thread::id thread_ GUARDED_BY(rd_.mu_);
  CondVar cv_;  // done_ or has_token_
  bool done_ GUARDED_BY(rd_.mu_) = false;
  // done_, readable without rd_.mu_: set (release) after result_, under rd_.mu_.
  std::atomic<bool> ready_{false};
  bool has_token_ GUARDED_BY(rd_.mu_) = false;  // handed the token (or took it): it leads
  Result result_ GUARDED_BY(rd_.mu_);
};

}  // namespace outrun::detail
