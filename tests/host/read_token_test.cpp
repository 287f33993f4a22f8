// The read token alone (no host, no worker process): threads play the loop, the leader and the
// waiting callers of design/threading.md "Leader/follower". Workers are opaque addresses (the
// token never dereferences them); a hang (a lost hand-off, a missed kick) is reported by within().
#include "read_token.h"

#include <doctest/doctest.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace outrun;
using namespace outrun::detail;
using Holder = ReadToken::Holder;
using namespace std::chrono_literals;

namespace {

// Two fake workers: addresses the token compares, never reads.
alignas(64) unsigned char worker_storage[2];
WorkerProcess* const kW1 = reinterpret_cast<WorkerProcess*>(&worker_storage[0]);
WorkerProcess* const kW2 = reinterpret_cast<WorkerProcess*>(&worker_storage[1]);

// Runs `fn` on a thread of its own and waits for it at most `limit`: a protocol that loses a
// hand-off or a wake-up hangs, which stops the test binary with a message (red, not stuck).
void within(std::chrono::seconds limit, const std::function<void()>& fn) {
  std::promise<void> done;
  std::future<void> f = done.get_future();
  std::thread t([&] {
    fn();
    done.set_value();
  });
  if (f.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "read_token_test: hung for %lld s (a lost hand-off or wake-up)\n",
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(1);
  }
  t.join();
}

// Waits (polling) until `cond` holds, for at most 5 s.
bool eventually(const std::function<bool()>& cond) {
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

Result ok_result(int tag) {
  Result r;
  r.shard = tag;
  return r;
}

Result error_result(const char* why) {
  Result r;
  r.status = Status::runtime_error;
  r.error = why;
  return r;
}

// The kick eventfd is readable now (a leader polling it would wake).
bool kicked(const ReadToken& tok) {
  pollfd p{tok.kick_fd(), POLLIN, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

// The leader's part of wait_for_result: lead until `me` is done, the loop wants the token or
// the worker changed, polling the kick eventfd (the result socket is not there).
void lead_until_stopped(ReadToken& tok, SyncWaiter& me, WorkerProcess* w) REQUIRES(tok.token) {
  while (!tok.leader_must_stop(me, w)) {
    pollfd p{tok.kick_fd(), POLLIN, 0};
    if (poll(&p, 1, 20'000) > 0) tok.clear_kick();
  }
}

// REQUIRE(tok.wait_to_lead(...)) and REQUIRE(tok.loop_acquire(...)) for the thread-safety
// analysis, which does not see a try-acquire through doctest's expression decomposition.
void lead_now(ReadToken& tok, SyncWaiter& me, WorkerProcess** w) ACQUIRE(tok.token) {
  if (!tok.wait_to_lead(me, w)) throw std::logic_error("expected to lead");
}
void loop_take(ReadToken& tok, Handoff* left) ACQUIRE(tok.token) {
  bool pause = false;
  if (!tok.loop_acquire(&pause, left)) throw std::logic_error("expected the loop to take it");
}

}  // namespace

TEST_CASE("read token: one leader at a time among N threads, each handed the token in turn") {
  ReadToken tok;
  tok.attach(kW1);
  Mutex shard_mu;  // stands for Shard::mu: the releases are made under it
  constexpr int kThreads = 8, kRounds = 300;
  std::atomic<int> leading{0}, most{0}, led{0}, wrong_worker{0}, not_held{0};
  within(30s, [&] {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < kRounds; ++i) {
          SyncWaiter me(tok);
          WorkerProcess* w = nullptr;
          // Only the leader reads results, and each reads only its own: a waiter whose turn
          // is lost is never fulfilled and hangs (within()).
          while (tok.wait_to_lead(me, &w)) {
            const int now = ++leading;
            int m = most.load();
            while (now > m && !most.compare_exchange_weak(m, now)) {
            }
            if (w != kW1) ++wrong_worker;
            if (!tok.held() || tok.holder() != Holder::kLeader) ++not_held;
            std::this_thread::yield();
            me.fulfil(ok_result(t));  // its own result, read by itself: wakes nobody
            ++led;
            --leading;
            MutexLock lock(shard_mu);
            CHECK_FALSE(tok.leader_release(me, {}, false));  // nothing paused: no wake-up
          }
          CHECK(me.ready());
          CHECK(me.take().shard == t);
        }
      });
    for (auto& th : threads) th.join();
  });
  CHECK(most.load() == 1);
  CHECK(led.load() == kThreads * kRounds);
  CHECK(wrong_worker.load() == 0);
  CHECK(not_held.load() == 0);
  CHECK(tok.holder() == Holder::kNone);
  CHECK_FALSE(tok.held());
  CHECK(tok.waiting() == 0);
}

TEST_CASE("read token: the loop's release hands the token to a waiting caller, who leads") {
  ReadToken tok;
  tok.attach(kW1);
  SyncWaiter me(tok);
  within(10s, [&] {
    Handoff left;
    loop_take(tok, &left);
    CHECK(tok.holder() == Holder::kLoop);
    CHECK_FALSE(left.read);
    CHECK(left.violation.empty());
    std::atomic<bool> led{false};
    std::thread caller([&] {
      WorkerProcess* w = nullptr;
      if (tok.wait_to_lead(me, &w)) {  // blocks: the loop reads
        led = true;
        CHECK(w == kW1);
        CHECK(tok.holder() == Holder::kLeader);
        me.fulfil(ok_result(7));
        CHECK_FALSE(tok.leader_release(me, {}, false));
      }
    });
    REQUIRE(eventually([&] { return tok.waiting() == 1; }));
    CHECK_FALSE(led.load());
    CHECK_FALSE(tok.loop_release(kW1, /*poison=*/false, /*in_flight=*/true));  // handed over
    caller.join();
    CHECK(led.load());
  });
  CHECK(me.take().shard == 7);
  CHECK(tok.holder() == Holder::kNone);
}

TEST_CASE("read token: a poisoned source is handed to nobody, the waiter is fulfilled by another") {
  ReadToken tok;
  tok.attach(kW1);
  SyncWaiter me(tok);
  within(10s, [&] {
    Handoff left;
    loop_take(tok, &left);
    std::atomic<int> outcome{-1};
    std::thread caller([&] {
      WorkerProcess* w = nullptr;
      if (tok.wait_to_lead(me, &w)) {  // wrong: handed a token for a worker nobody reads
        outcome = 1;
        CHECK_FALSE(tok.leader_release(me, {}, false));
        return;
      }
      outcome = 0;
    });
    REQUIRE(eventually([&] { return tok.waiting() == 1; }));
    // The loop read an end of stream: nobody reads kW1 again, so nobody is handed the token.
    CHECK_FALSE(tok.loop_release(kW1, /*poison=*/true, /*in_flight=*/true));
    CHECK(tok.holder() == Holder::kNone);
    std::this_thread::sleep_for(20ms);
    CHECK(outcome.load() == -1);             // still waiting
    me.fulfil(error_result("worker died"));  // the death ends its evaluation
    caller.join();
    CHECK(outcome.load() == 0);
  });
  CHECK(me.take().status == Status::runtime_error);
}

TEST_CASE("read token: take_for_death kicks the leader off and gets the token before any waiter") {
  ReadToken tok;
  tok.attach(kW1);
  Mutex shard_mu;
  SyncWaiter leader(tok), queued(tok);
  within(15s, [&] {
    std::atomic<bool> leading{false}, stopped{false};
    std::atomic<int> queued_outcome{-1};
    std::thread lead_thread([&] {
      WorkerProcess* w = nullptr;
      if (tok.wait_to_lead(leader, &w)) {
        leading = true;
        lead_until_stopped(tok, leader, w);  // until the loop wants the token (kicked)
        CHECK(tok.loop_wants());
        stopped = true;
        MutexLock lock(shard_mu);
        CHECK_FALSE(tok.leader_release(leader, {}, true));  // to the loop: no wake-up
      }
    });
    REQUIRE(eventually([&] { return leading.load(); }));
    std::thread queued_thread([&] {
      WorkerProcess* w = nullptr;
      if (tok.wait_to_lead(queued, &w)) {
        queued_outcome = 1;  // wrong: the dying worker's token went to a caller
        MutexLock lock(shard_mu);
        tok.leader_release(queued, {}, false);
        return;
      }
      queued_outcome = 0;
    });
    REQUIRE(eventually([&] { return tok.waiting() == 1; }));

    tok.take_for_death(kW1);  // blocks until the leader hands it over (its poll is kicked)
    CHECK(stopped.load());
    CHECK(tok.holder() == Holder::kLoop);
    CHECK_FALSE(tok.loop_wants());
    lead_thread.join();
    // The death drains what was sent and ends the rest: the queued caller sees its end.
    std::this_thread::sleep_for(10ms);
    CHECK(queued_outcome.load() == -1);
    queued.fulfil(error_result("worker died"));
    queued_thread.join();
    CHECK(queued_outcome.load() == 0);
    tok.release_after_death();
    CHECK(tok.holder() == Holder::kNone);
  });
  CHECK(queued.take().status == Status::runtime_error);

  // No source until the next worker: a new waiter queues, and the loop's first read of the
  // new worker hands it the token for that worker.
  SyncWaiter next(tok);
  within(10s, [&] {
    std::atomic<WorkerProcess*> got{nullptr};
    std::thread caller([&] {
      WorkerProcess* w = nullptr;
      if (tok.wait_to_lead(next, &w)) {
        got = w;
        next.fulfil(ok_result(2));
        MutexLock lock(shard_mu);
        tok.leader_release(next, {}, false);
      }
    });
    REQUIRE(eventually([&] { return tok.waiting() == 1; }));
    tok.attach(kW2);
    Handoff left;
    loop_take(tok, &left);
    {
      MutexLock lock(shard_mu);
      CHECK_FALSE(tok.loop_release(kW2, false, true));
    }
    caller.join();
    CHECK(got.load() == kW2);
  });
}

TEST_CASE("read token: a result delivered by another thread kicks its leader, its own does not") {
  ReadToken tok;
  tok.attach(kW1);
  SyncWaiter me(tok);
  within(10s, [&] {
    std::atomic<bool> leading{false};
    std::thread caller([&] {
      WorkerProcess* w = nullptr;
      if (tok.wait_to_lead(me, &w)) {
        leading = true;
        lead_until_stopped(tok, me, w);  // woken by the kick of the fulfilment below
        tok.leader_release(me, {}, false);
      }
    });
    REQUIRE(eventually([&] { return leading.load(); }));
    me.fulfil(ok_result(3));  // e.g. the loop at a death, or a refusal
    caller.join();
  });
  CHECK(me.take().shard == 3);

  SyncWaiter self(tok);
  WorkerProcess* w = nullptr;
  lead_now(tok, self, &w);
  self.fulfil(ok_result(4));  // read by the leader itself
  CHECK_FALSE(kicked(tok));
  CHECK(tok.leader_must_stop(self, w));
  tok.leader_release(self, {}, false);
}

TEST_CASE(
    "read token: submitter_must_resume asks once, only while the loop is paused and nobody reads") {
  ReadToken tok;
  tok.attach(kW1);
  CHECK_FALSE(tok.submitter_must_resume());  // the loop polls
  CHECK_FALSE(tok.submitter_would_resume());

  SyncWaiter me(tok);
  WorkerProcess* w = nullptr;
  lead_now(tok, me, &w);
  bool pause = false;
  Handoff left;
  CHECK_FALSE(tok.loop_acquire(&pause, &left));
  CHECK(pause);  // the first time: stop polling now
  CHECK_FALSE(tok.loop_acquire(&pause, &left));
  CHECK_FALSE(pause);  // sticky
  CHECK(tok.loop_paused());
  // A leader holds the token: it sees what is sent when it releases, nobody asks.
  CHECK_FALSE(tok.submitter_would_resume());
  CHECK_FALSE(tok.submitter_must_resume());

  me.fulfil(ok_result(1));
  CHECK_FALSE(tok.leader_release(me, {}, /*in_flight=*/false));  // nothing in flight: stay paused
  CHECK(tok.loop_paused());
  CHECK(tok.submitter_would_resume());  // looks, does not claim
  CHECK(tok.submitter_would_resume());
  CHECK(tok.submitter_must_resume());  // claims the ask
  CHECK_FALSE(tok.submitter_must_resume());
  CHECK_FALSE(tok.submitter_would_resume());
  CHECK(tok.loop_attend() == ReadToken::Attend::kPoll);
  CHECK_FALSE(tok.loop_paused());
  CHECK(tok.loop_attend() == ReadToken::Attend::kNothing);
  CHECK_FALSE(tok.submitter_must_resume());

  // A leader giving the token up with evaluations in flight while the loop is paused asks once.
  SyncWaiter again(tok);
  lead_now(tok, again, &w);
  CHECK_FALSE(tok.loop_acquire(&pause, &left));
  CHECK(pause);
  again.fulfil(ok_result(2));
  CHECK(tok.leader_release(again, {}, /*in_flight=*/true));
  CHECK_FALSE(tok.submitter_must_resume());  // already asked
  CHECK(tok.loop_attend() == ReadToken::Attend::kPoll);
}

TEST_CASE("read token: what a leader leaves (a read, a violation) goes to the loop first") {
  ReadToken tok;
  tok.attach(kW1);
  SyncWaiter me(tok);
  WorkerProcess* w = nullptr;
  lead_now(tok, me, &w);
  me.fulfil(ok_result(1));
  Handoff h;
  h.read = true;
  CHECK(tok.leader_release(me, std::move(h), false));  // the loop must be woken
  CHECK(tok.holder() == Holder::kNone);

  // While the hand-off waits, a caller does not lead: it queues.
  SyncWaiter other(tok);
  within(10s, [&] {
    std::atomic<WorkerProcess*> got{nullptr};
    std::thread caller([&] {
      WorkerProcess* ww = nullptr;
      if (tok.wait_to_lead(other, &ww)) {
        got = ww;
        other.fulfil(ok_result(2));
        tok.leader_release(other, {}, false);
      }
    });
    REQUIRE(eventually([&] { return tok.waiting() == 1; }));
    CHECK(tok.holder() == Holder::kNone);
    CHECK(tok.loop_attend() == ReadToken::Attend::kRead);
    Handoff left;
    loop_take(tok, &left);
    CHECK(left.read);
    CHECK(tok.loop_release(kW1, false, false) == false);  // to the queued caller
    caller.join();
    CHECK(got.load() == kW1);
  });

  // A violation: the worker stops being the source, and the loop gets it.
  SyncWaiter third(tok);
  lead_now(tok, third, &w);
  third.fulfil(ok_result(3));
  Handoff v;
  v.violation = "bad frame";
  CHECK(tok.leader_release(third, std::move(v), false));
  Handoff left;
  loop_take(tok, &left);
  CHECK(left.violation == "bad frame");
  CHECK_FALSE(left.read);
  tok.loop_release(kW1, /*poison=*/true, false);
  SyncWaiter fourth(tok);
  std::thread late([&] {
    WorkerProcess* ww = nullptr;
    CHECK_FALSE(tok.wait_to_lead(fourth, &ww));  // no source: waits for its result
  });
  REQUIRE(eventually([&] { return tok.waiting() == 1; }));
  fourth.fulfil(ok_result(4));
  late.join();
}
