// evaluate_sync: a caller that waits for its result reads it itself (leader/follower), so a round
// trip costs the host one wake-up, the caller's (design/threading.md "Leader/follower").
//
// Per shard one read token (ReadToken, read_token.h: the protocol's owner) says who reads the
// current worker's result socket and its FrameReader: the loop thread while it reads, or one
// waiting caller, the leader, which reads with the shard reader (ShardReader::lead,
// shard_reader.cpp) until its own result is in, then hands the token on.
#include "host_impl.h"
#include "outrun/protocol/messages.h"

namespace outrun {

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
  while (sh.reading.wait_to_lead(me, &w))
    if (reader.lead(sh, w, me)) wake();
}

}  // namespace outrun
