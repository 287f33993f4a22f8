// evaluate_sync: a caller that waits for its result reads it itself (leader/follower), so a round
// trip costs the host one wake-up, the caller's (design/threading.md "Leader/follower").
//
// Per shard one read token (ReadToken) says who reads the current worker's result socket and its
// FrameReader: the loop thread while it reads, or one waiting caller, the leader. The leader
// polls the socket and the token's kick eventfd, handles Results frames exactly as the loop does
// (slots released under the shard's mutex, futures and waiters fulfilled, callbacks posted to
// the dispatcher: no caller code runs here) until its own result is in, then hands the token on.
// Everything else (a hello, an end of stream, a read error, a protocol violation) is left to the
// loop, which also keeps every timer, every kill and every death.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>

#include "host_impl.h"
#include "outrun/protocol/messages.h"

namespace outrun {

using detail::Delivery;
using detail::ReadToken;
using detail::Shard;
using detail::SyncWaiter;
using detail::WorkerProcess;
using Holder = detail::ReadToken::Holder;

namespace detail {

ReadToken::ReadToken() : kick_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

ReadToken::~ReadToken() {
  if (kick_fd >= 0) close(kick_fd);
}

void ReadToken::kick() const {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(kick_fd, &one, sizeof one);  // EAGAIN: already kicked
}

void fulfil(SyncWaiter& w, Result&& r) {
  MutexLock lock(w.rd.mu);
  w.result = std::move(r);
  w.done = true;
  w.ready.store(true, std::memory_order_release);
  if (std::this_thread::get_id() == w.thread) return;  // the leader read its own result
  // Delivered by another thread (the loop at a death, a refusal, a coalesced replacement): wake
  // it, in its condition variable or, while it leads, in its poll.
  if (w.has_token) w.rd.kick();
  w.cv.notify_one();
}

void fulfil(HostFuture& f, Result&& r) {
  fulfil(f.waiter, std::move(r));
}

bool HostFuture::take_turn(const std::chrono::steady_clock::time_point* deadline) {
  MutexLock lock(turn_mu);
  auto free = [&]() REQUIRES(turn_mu) { return !turn_taken; };
  if (deadline) {
    if (!turn_cv.wait_until(turn_mu, *deadline, free)) return false;
  } else {
    turn_cv.wait(turn_mu, free);
  }
  turn_taken = true;
  return true;
}

void HostFuture::end_turn() {
  {
    MutexLock lock(turn_mu);
    turn_taken = false;
  }
  turn_cv.notify_one();
}

void HostFuture::wait() {
  if (waiter.ready.load(std::memory_order_acquire)) return;
  take_turn(nullptr);
  // Not ready (another thread may have waited it out meanwhile) and the gate open: wait here.
  if (!waiter.ready.load(std::memory_order_acquire) && gate->enter()) {
    impl->wait_for_result(*shard, waiter);
    gate->leave();
  }
  end_turn();
}

void HostFuture::settle_resume() {
  if (owes_resume.load(std::memory_order_relaxed) &&
      owes_resume.exchange(false, std::memory_order_relaxed))
    impl->resume_if_paused(*shard);
}

void HostFuture::abandon() {
  if (waiter.ready.load(std::memory_order_acquire) || !gate->enter()) return;
  settle_resume();
  gate->leave();
}

bool HostFuture::wait_for(std::chrono::nanoseconds d) {
  if (waiter.ready.load(std::memory_order_acquire)) return true;
  const auto deadline = std::chrono::steady_clock::now() + d;
  if (!take_turn(&deadline)) return waiter.ready.load(std::memory_order_acquire);
  bool in = true;  // the gate closed: the host ended every evaluation before it closed
  if (gate->enter()) {
    settle_resume();
    {
      // Never leads: a timed wait is handed its result by whoever reads it (the loop, a
      // leader).
      MutexLock lock(waiter.rd.mu);
      in = waiter.cv.wait_until(waiter.rd.mu, deadline,
                                [&]() REQUIRES(waiter.rd.mu) { return waiter.done; });
    }
    gate->leave();
  }
  end_turn();
  return in;
}

// After wait() or a true wait_for(): `ready` was read (acquire) or `done` under the mutex, and
// nothing writes the result again.
Result HostFuture::take() NO_THREAD_SAFETY_ANALYSIS {
  return std::move(waiter.result);
}

}  // namespace detail

Result Host::Impl::evaluate_sync(const Script& script, Inputs&& inputs) {
  const detail::ScriptRecord* r = script.record();
  Shard& sh = r && r->owner == this ? route(*r) : *shards[0];
  SyncWaiter me(sh.reading);
  submit(script, std::move(inputs), detail::Completion(&me), {}, &sh);  // waits on that shard
  wait_for_result(sh, me);
  MutexLock lock(me.rd.mu);
  return std::move(me.result);
}

void Host::Impl::wait_for_result(Shard& sh, SyncWaiter& me) {
  for (;;) {
    WorkerProcess* w = nullptr;
    {
      MutexLock lock(sh.reading.mu);
      me.rd.mu.assert_held();  // me.rd is sh.reading
      me.thread = std::this_thread::get_id();
      if (!me.has_token) {
        if (me.done) return;
        if (sh.reading.holder == Holder::kNone && sh.reading.source && !sh.reading.loop_wants &&
            !sh.reading.handoff_read && sh.reading.handoff_violation.empty()) {
          sh.reading.set_holder(Holder::kLeader);
          me.has_token = true;
        } else {
          // Someone reads (the loop, or a leader that will hand the token on), or the shard has
          // no readable worker (the loop reads the next one): wait for the result or the token.
          sh.reading.followers.push_back(&me);
          me.cv.wait(sh.reading.mu, [&]() REQUIRES(sh.reading.mu) {
            me.rd.mu.assert_held();
            return me.done || me.has_token;
          });
          std::erase(sh.reading.followers, &me);
          if (!me.has_token) return;
        }
      }
      w = sh.reading.source;  // null: it stopped being readable since the token was handed over
    }
    sh.reading.token.acquire();
    Handoff h;
    if (w) h = lead(sh, w, me);
    if (leader_release(sh, me, std::move(h))) wake();
  }
}

Host::Impl::Handoff Host::Impl::lead(Shard& sh, WorkerProcess* w, SyncWaiter& me) {
  Handoff h;
  thread_local std::vector<Delivery> to_dispatch;
  pollfd fds[2] = {{w->result_fd(), POLLIN, 0}, {sh.reading.kick_fd, POLLIN, 0}};
  for (;;) {
    {
      MutexLock lock(sh.reading.mu);
      me.rd.mu.assert_held();  // me.rd is sh.reading
      if (me.done || sh.reading.loop_wants || sh.reading.source != w) break;
    }
    const long n = w->reader().read_from(w->result_fd());
    if (n == -EAGAIN) {
      fds[0].revents = fds[1].revents = 0;
      if (poll(fds, 2, -1) > 0 && (fds[1].revents & POLLIN)) {
        uint64_t v;
        [[maybe_unused]] ssize_t k = read(sh.reading.kick_fd, &v, sizeof v);
      }
      continue;
    }
    if (n <= 0) {  // end of stream or an error: the loop's to handle (it reads again)
      h.read = true;
      break;
    }
    sh.reads.fetch_add(1, std::memory_order_relaxed);
    lead_frames(sh, w, &h, &to_dispatch);
    if (h.read || !h.violation.empty()) break;
  }
  return h;
}

// Like process_frames, for Results frames only: any other frame is put back for the loop.
void Host::Impl::lead_frames(Shard& sh, WorkerProcess* w, Handoff* h,
                             std::vector<Delivery>* to_dispatch) {
  protocol::FrameView fv;
  while (w->reader().next(fv)) {
    // greeted(): written by the loop only while it holds the token.
    if (fv.frame->body_type() != wire::Body::Results || !w->greeted()) {
      w->reader().put_back();
      h->read = true;
      break;
    }
    sh.frames.fetch_add(1, std::memory_order_relaxed);
    protocol::WorkerMessage m;
    if (!protocol::decode_worker_frame(fv.frame, &m, &h->violation)) break;
    handle_results(sh, w, std::get<protocol::ResultsMsg>(m).items, &h->violation, to_dispatch);
    if (!h->violation.empty()) break;
  }
  // A broken stream: the loop reads its error from the reader and kills the worker.
  if (!h->read && h->violation.empty() && w->reader().error() != protocol::FrameError::kNone)
    h->read = true;
  if (!to_dispatch->empty()) sh.dispatcher->post(*to_dispatch);  // per read, never batched up
}

bool Host::Impl::hand_to_waiter(Shard& sh) {
  if (!sh.reading.source || sh.reading.handoff_read || !sh.reading.handoff_violation.empty())
    return false;
  for (SyncWaiter* f : sh.reading.followers) {
    assert(&f->rd == &sh.reading);  // a waiter waits on its own shard's token
    f->rd.mu.assert_held();
    if (!f->done && !f->has_token) {
      f->has_token = true;
      sh.reading.set_holder(Holder::kLeader);
      f->cv.notify_one();
      return true;
    }
  }
  return false;
}

bool Host::Impl::leader_release(Shard& sh, SyncWaiter& me, Handoff&& h) {
  sh.reading.token.release();
  // Shard::mu for in_use(): it and loop_paused are read together, under both mutexes, so an
  // evaluation sent while the loop does not poll is either counted here or sees loop_paused
  // (Host::Impl::submit) and asks for the resume itself.
  MutexLock lock(sh.mu);
  MutexLock rlock(sh.reading.mu);
  me.rd.mu.assert_held();  // me.rd is sh.reading
  me.has_token = false;
  if (h.read) sh.reading.handoff_read = true;
  if (!h.violation.empty()) {
    sh.reading.handoff_violation = std::move(h.violation);
    sh.reading.source = nullptr;  // nobody reads a worker that violated the protocol again
  }
  if (sh.reading.loop_wants) {
    sh.reading.loop_wants = false;
    sh.reading.set_holder(Holder::kLoop);
    sh.reading.loop_cv.notify_one();
    return false;
  }
  if (sh.reading.handoff_read || !sh.reading.handoff_violation.empty()) {
    sh.reading.set_holder(Holder::kNone);
    return true;  // the loop acts on it (on_wakeup -> attend_reading)
  }
  if (hand_to_waiter(sh)) return false;
  sh.reading.set_holder(Holder::kNone);
  return sh.reading.loop_paused.load() && sh.table.in_use() > 0 &&
         !sh.reading.resume_asked.exchange(true);
}

}  // namespace outrun
