// evaluate_sync: a caller that waits for its result reads it itself (leader/follower), so a round
// trip costs the host one wake-up, the caller's (design/threading.md "Leader/follower").
//
// Per shard one read token (ReadToken, read_token.h: the protocol's owner) says who reads the
// current worker's result socket and its FrameReader: the loop thread while it reads, or one
// waiting caller, the leader. The leader
// polls the socket and the token's kick eventfd, handles Results frames exactly as the loop does
// (slots released under the shard's mutex, futures and waiters fulfilled, callbacks posted to
// the dispatcher: no caller code runs here) until its own result is in, then hands the token on.
// Everything else (a hello, an end of stream, a read error, a protocol violation) is left to the
// loop, which also keeps every timer, every kill and every death.
#include <poll.h>

#include <cerrno>

#include "host_impl.h"
#include "outrun/protocol/messages.h"

namespace outrun {

using detail::Delivery;
using detail::Handoff;
using detail::Shard;
using detail::SyncWaiter;
using detail::WorkerProcess;

namespace detail {

void fulfil(SyncWaiter& w, Result&& r) {
  w.fulfil(std::move(r));
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
  if (waiter.ready()) return;
  take_turn(nullptr);
  // Not ready (another thread may have waited it out meanwhile) and the gate open: wait here.
  if (!waiter.ready() && gate->enter()) {
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
  if (waiter.ready() || !gate->enter()) return;
  settle_resume();
  gate->leave();
}

bool HostFuture::wait_for(std::chrono::nanoseconds d) {
  if (waiter.ready()) return true;
  const auto deadline = std::chrono::steady_clock::now() + d;
  if (!take_turn(&deadline)) return waiter.ready();
  bool in = true;  // the gate closed: the host ended every evaluation before it closed
  if (gate->enter()) {
    settle_resume();
    // Never leads: a timed wait is handed its result by whoever reads it (the loop, a leader).
    in = waiter.wait_until(deadline);
    gate->leave();
  }
  end_turn();
  return in;
}

// After wait() or a true wait_for() (SyncWaiter::take_ready).
Result HostFuture::take() {
  return waiter.take_ready();
}

}  // namespace detail

Result Host::Impl::evaluate_sync(const Script& script, Inputs&& inputs) {
  const detail::ScriptRecord* r = detail::record_of(script);
  Shard& sh = r && r->owner == this ? route(*r) : *shards[0];
  SyncWaiter me(sh.reading);
  submit(script, std::move(inputs), detail::Completion(&me), {}, &sh);  // waits on that shard
  wait_for_result(sh, me);
  return me.take();
}

void Host::Impl::wait_for_result(Shard& sh, SyncWaiter& me) {
  WorkerProcess* w = nullptr;
  while (sh.reading.wait_to_lead(me, &w)) {
    Handoff h;
    if (w) h = lead(sh, w, me);
    if (leader_release(sh, me, std::move(h))) wake();
  }
}

Handoff Host::Impl::lead(Shard& sh, WorkerProcess* w, SyncWaiter& me) {
  Handoff h;
  thread_local std::vector<Delivery> to_dispatch;
  pollfd fds[2] = {{w->result_fd(), POLLIN, 0}, {sh.reading.kick_fd(), POLLIN, 0}};
  for (;;) {
    if (sh.reading.leader_must_stop(me, w)) break;
    const long n = w->reader().read_from(w->result_fd());
    if (n == -EAGAIN) {
      fds[0].revents = fds[1].revents = 0;
      if (poll(fds, 2, -1) > 0 && (fds[1].revents & POLLIN)) sh.reading.clear_kick();
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

bool Host::Impl::leader_release(Shard& sh, SyncWaiter& me, Handoff&& h) {
  // Shard::mu for in_use(): it and loop_paused are read together, under both mutexes, so an
  // evaluation sent while the loop does not poll is either counted here or sees loop_paused
  // (Host::Impl::submit) and asks for the resume itself.
  MutexLock lock(sh.mu);
  return sh.reading.leader_release(me, std::move(h), sh.table.in_use() > 0);
}

}  // namespace outrun
