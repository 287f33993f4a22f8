// The slot table alone (no host, no worker): admission, single flight and coalescing, release
// and promotion, stale ids, every transition of a slot (sent, NeedSource, the waiting queue),
// and what a worker's death settles: which evaluations are retried, which end, with what status.
#include "slot_table.h"

#include <doctest/doctest.h>

#include <memory>
#include <optional>

#include "restart_policy.h"
#include "script_registry.h"

using namespace outrun;
using namespace outrun::detail;

namespace {

// Script handles of a real registry (the table reads their key ids), no host behind them.
struct Scripts {
  ScriptRegistry registry{nullptr, 1, 1u << 20, /*deferred_ids=*/false};
  Script get(const char* key) {
    Script s;
    REQUIRE_FALSE(registry.add(key, "return 1", &s));
    return s;
  }
};

struct Done {
  std::shared_ptr<std::optional<Result>> got = std::make_shared<std::optional<Result>>();
  Completion completion() {
    return Completion(Callback([g = got](Result r) { *g = std::move(r); }));
  }
  bool ready() const { return got->has_value(); }
  Status status() const { return (*got)->status; }
};

// Admits an evaluation and writes it to the (imagined) worker at once, as submit() does.
uint32_t send(SlotTable& t, const Script& s, Done& d, bool single = false) {
  const uint32_t idx = t.admit(s, {}, d.completion(), SlotPlace::kSending, single);
  t.mark_sent(idx, SentWith::kId);
  return idx;
}

Result finish(Completion c, Status s) {
  Result r;
  r.status = s;
  Log log{{}};
  c.deliver(Result{r}, log);
  return r;
}

}  // namespace

TEST_CASE("slot table: admit, release, ids are never reused for a freed slot") {
  Scripts scripts;
  Script a = scripts.get("a");
  SlotTable t;
  Done d1;
  const uint32_t i = send(t, a, d1);
  const uint64_t id = t.id(i);
  CHECK(id != 0);
  CHECK(t.sent(id) == &t[i]);
  std::vector<uint32_t> promoted;
  Completion c = t.release(i, &promoted);
  CHECK(promoted.empty());
  finish(std::move(c), Status::ok);
  CHECK(d1.ready());
  // Freed: the old id answers nothing, and the reused slot has a new id.
  CHECK(t.sent(id) == nullptr);
  CHECK(t[i].place == SlotPlace::kFree);
  Done d2;
  const uint32_t j = send(t, a, d2);
  CHECK(j == i);
  CHECK(t.id(j) != id);
  CHECK(t.sent(id) == nullptr);
  CHECK(t.sent(t.id(j)) == &t[j]);
  // Forged ids: out of range, never sent.
  CHECK(t.sent(uint64_t{1} << 32 | 999) == nullptr);
  Done d3;
  const uint32_t w = t.admit(a, {}, d3.completion(), SlotPlace::kQueued, false);
  CHECK(t.sent(t.id(w)) == nullptr);
  CHECK(t.waiting_count() == 1);
  CHECK(t.in_use() == 2);
}

TEST_CASE("slot table: single flight holds the key until the evaluation ends") {
  Scripts scripts;
  Script a = scripts.get("a"), b = scripts.get("b");
  SlotTable t;
  Done d1, d2;
  CHECK_FALSE(t.in_flight(detail::record_of(a)->key_id));
  const uint32_t i = send(t, a, d1, true);
  CHECK(t.in_flight(detail::record_of(a)->key_id));
  CHECK_FALSE(t.in_flight(detail::record_of(b)->key_id));
  t.admit(b, {}, d2.completion(), SlotPlace::kQueued, true);
  CHECK(t.in_flight(detail::record_of(b)->key_id));
  std::vector<uint32_t> promoted;
  t.release(i, &promoted);
  CHECK_FALSE(t.in_flight(detail::record_of(a)->key_id));
  // Without single flight the key is never taken.
  Done d3;
  send(t, a, d3);
  CHECK_FALSE(t.in_flight(detail::record_of(a)->key_id));
}

TEST_CASE("slot table: coalesce-latest keeps one waiting behind the flight and promotes it") {
  Scripts scripts;
  Script a = scripts.get("a");
  SlotTable t;
  Done first, second, third;
  const uint32_t i = send(t, a, first, true);
  Completion replaced;
  const uint32_t p2 = t.admit_pending(a, {}, second.completion(), &replaced);
  CHECK(replaced.empty());
  CHECK(t[p2].place == SlotPlace::kPending);
  // A third replaces the second, whose completion comes back to be ended `busy`.
  const uint32_t p3 = t.admit_pending(a, {}, third.completion(), &replaced);
  REQUIRE_FALSE(replaced.empty());
  finish(std::move(replaced), Status::busy);
  CHECK(second.ready());
  CHECK(second.status() == Status::busy);
  CHECK_FALSE(third.ready());
  // The first ends: the third takes the flight, promoted to be sent (no longer pending).
  std::vector<uint32_t> promoted;
  finish(t.release(i, &promoted), Status::ok);
  REQUIRE(promoted == std::vector<uint32_t>{p3});
  CHECK(t[p3].place == SlotPlace::kSending);
  CHECK(t.in_flight(detail::record_of(a)->key_id));
  t.mark_sent(p3, SentWith::kId);
  CHECK(t.sent(t.id(p3)) == &t[p3]);
  // Ending the promoted one frees the flight (it is not mistaken for a pending one).
  std::vector<uint32_t> none;
  finish(t.release(p3, &none), Status::ok);
  CHECK(none.empty());
  CHECK_FALSE(t.in_flight(detail::record_of(a)->key_id));
}

TEST_CASE("slot table: the waiting queue - admit, take, send, park, in order") {
  Scripts scripts;
  Script a = scripts.get("a");
  SlotTable t;
  std::vector<Done> done(3);
  std::vector<uint32_t> q;
  for (auto& d : done) q.push_back(t.admit(a, {}, d.completion(), SlotPlace::kQueued, false));
  CHECK(t.waiting() == q);
  for (uint32_t idx : q) CHECK(t[idx].place == SlotPlace::kQueued);
  // A new worker: the whole queue is taken, in order, to be sent.
  CHECK(t.take_waiting() == q);
  CHECK(t.waiting_count() == 0);
  for (uint32_t idx : q) CHECK(t[idx].place == SlotPlace::kSending);
  t.mark_sent(q[0], SentWith::kSource);
  CHECK(t[q[0]].place == SlotPlace::kSent);
  CHECK(t.sent(t.id(q[0])) == &t[q[0]]);
  // The shard went down meanwhile: the others wait again, at the back, in the order parked.
  Done d4;
  const uint32_t w = t.admit(a, {}, d4.completion(), SlotPlace::kQueued, false);
  t.park(q[2]);
  t.park(q[1]);
  CHECK(t.waiting() == std::vector<uint32_t>{w, q[2], q[1]});
  CHECK(t[q[1]].place == SlotPlace::kQueued);
  CHECK(t.sent(t.id(q[1])) == nullptr);
}

TEST_CASE("slot table: NeedSource - one ask for the script, one more for bytecode that failed") {
  Scripts scripts;
  Script a = scripts.get("a");
  SlotTable t;
  SUBCASE("sent by id or with its source: one ask, then a violation") {
    for (SentWith with : {SentWith::kId, SentWith::kSource}) {
      Done d;
      const uint32_t i = t.admit(a, {}, d.completion(), SlotPlace::kSending, false);
      t.mark_sent(i, with);
      CHECK(t[i].source == SourceState::kUnasked);
      REQUIRE(t.need_source(i));
      CHECK(t[i].source == SourceState::kAsked);
      CHECK(t[i].place == SlotPlace::kSending);
      CHECK(t.sent(t.id(i)) == nullptr);  // an answer for it now would be a violation
      CHECK(t[i].may_send_bytecode());
      t.mark_sent(i, SentWith::kSource);
      CHECK_FALSE(t.need_source(i));          // asked twice
      CHECK(t[i].place == SlotPlace::kSent);  // unchanged: the worker's death settles it
      CHECK(t[i].source == SourceState::kAsked);
    }
  }
  SUBCASE("sent with bytecode: its refusal, then one ask for the source text") {
    Done d;
    const uint32_t i = t.admit(a, {}, d.completion(), SlotPlace::kSending, false);
    t.mark_sent(i, SentWith::kBytecode);
    CHECK(t[i].source == SourceState::kBytecodeSent);
    REQUIRE(t.need_source(i));  // the bytecode did not load
    CHECK(t[i].source == SourceState::kBytecodeRefused);
    CHECK_FALSE(t[i].may_send_bytecode());
    t.mark_sent(i, SentWith::kSource);
    CHECK(t[i].source == SourceState::kBytecodeRefused);
    REQUIRE(t.need_source(i));  // the one ask for the script
    CHECK(t[i].source == SourceState::kSpent);
    CHECK_FALSE(t[i].may_send_bytecode());
    t.mark_sent(i, SentWith::kSource);
    CHECK_FALSE(t.need_source(i));
  }
  SUBCASE("asked, then sent with bytecode: it may still refuse that") {
    Done d;
    const uint32_t i = t.admit(a, {}, d.completion(), SlotPlace::kSending, false);
    t.mark_sent(i, SentWith::kId);
    REQUIRE(t.need_source(i));
    t.mark_sent(i, SentWith::kBytecode);
    CHECK(t[i].source == SourceState::kAskedBytecodeSent);
    REQUIRE(t.need_source(i));
    CHECK(t[i].source == SourceState::kSpent);
    t.mark_sent(i, SentWith::kSource);
    CHECK_FALSE(t.need_source(i));
  }
  SUBCASE("a send by id says nothing new; a send of source text after bytecode does") {
    Done d;
    const uint32_t i = t.admit(a, {}, d.completion(), SlotPlace::kSending, false);
    t.mark_sent(i, SentWith::kBytecode);
    REQUIRE(t.need_source(i));
    t.mark_sent(i, SentWith::kId);
    CHECK(t[i].source == SourceState::kBytecodeRefused);
    Done d2;
    const uint32_t j = t.admit(a, {}, d2.completion(), SlotPlace::kSending, false);
    t.mark_sent(j, SentWith::kBytecode);
    REQUIRE(t.need_source(j));
    REQUIRE(t.need_source(i));
    t.mark_sent(i, SentWith::kSource);
    CHECK(t[i].source == SourceState::kSpent);
  }
  SUBCASE("a re-send that will not happen stays with the worker") {
    Done d;
    const uint32_t i = send(t, a, d);
    REQUIRE(t.need_source(i));
    t.keep_with_worker(i);
    CHECK(t[i].place == SlotPlace::kSent);
    CHECK(t.sent(t.id(i)) == &t[i]);
  }
  SUBCASE("a reused slot starts with its asks") {
    Done d;
    const uint32_t i = send(t, a, d);
    REQUIRE(t.need_source(i));
    std::vector<uint32_t> promoted;
    finish(t.release(i, &promoted), Status::ok);
    Done d2;
    const uint32_t j = send(t, a, d2);
    REQUIRE(j == i);
    CHECK(t[j].source == SourceState::kUnasked);
    CHECK(t.need_source(j));
  }
}

namespace {

// A death's fate for each sent evaluation, as the host asks it (Host::Impl::settle_death).
std::function<std::optional<Result>(uint64_t, const Slot&)> policy_fate(const RestartPolicy& p,
                                                                        const Death& d,
                                                                        bool stopping) {
  return [&p, d, stopping](uint64_t id, const Slot& s) -> std::optional<Result> {
    EvaluationFate f = p.fate(d, stopping, id, d.running, d.overrun_id, s.retries);
    if (f.retry) return std::nullopt;
    return Result{f.status, {}, f.error, 0};
  };
}

}  // namespace

TEST_CASE("slot table: a death settles what was sent - retried ahead of the queue, or ended") {
  Scripts scripts;
  Script a = scripts.get("a"), b = scripts.get("b");
  RestartConfig config;
  config.retries = 1;
  RestartPolicy policy(0, config);
  SlotTable t;
  std::vector<Done> done(6);
  // s2 was retried once already: sent, its worker killed on request, sent to the next one.
  const uint32_t s2 = send(t, a, done[2]);
  {
    Death requested;
    requested.cause = DeathCause::kRequested;
    Ended none;
    std::vector<uint32_t> promoted;
    const std::vector<uint32_t> retried =
        t.settle(policy_fate(policy, requested, false), &none, &promoted);
    REQUIRE(retried == std::vector<uint32_t>{s2});
    CHECK(none.empty());
    t.requeue_retries(retried);
    REQUIRE(t.take_waiting() == std::vector<uint32_t>{s2});
    t.mark_sent(s2, SentWith::kSource);
  }
  REQUIRE(t[s2].retries == 1);
  // Also sent: s0 (it ran when the worker crashed), s1, and s3, which holds b's flight with a
  // coalesced successor pending behind it; w waits in the queue.
  const uint32_t s0 = send(t, a, done[0]);
  const uint32_t s1 = send(t, a, done[1]);
  const uint32_t w = t.admit(a, {}, done[3].completion(), SlotPlace::kQueued, false);
  const uint32_t s3 = send(t, b, done[4], true);
  Completion replaced;
  const uint32_t p = t.admit_pending(b, {}, done[5].completion(), &replaced);

  Death d;
  d.cause = DeathCause::kCrash;
  d.signal = 11;
  d.how = "was killed by signal 11 (Segmentation fault)";
  d.running = t.id(s0);
  Ended ended;
  std::vector<uint32_t> promoted;
  const std::vector<uint32_t> retried = t.settle(policy_fate(policy, d, false), &ended, &promoted);
  // s1 and s3 are retried (bystanders), in slot order, their retry counts up.
  REQUIRE(s0 < s1);
  REQUIRE(s1 < s3);
  CHECK(retried == std::vector<uint32_t>{s1, s3});
  CHECK(t[s1].retries == 1);
  CHECK(t[s1].place == SlotPlace::kSending);
  // s2 (out of retries) and s0 (the suspect) end worker_lost, in slot order, naming the cause.
  REQUIRE(ended.size() == 2);
  CHECK(ended[0].second.status == Status::worker_lost);
  CHECK(ended[0].second.error == "its worker was killed by signal 11 (Segmentation fault)");
  CHECK(ended[1].second.status == Status::worker_lost);
  Log log{{}};
  for (auto& e : ended) e.first.deliver(Result{e.second}, log);
  CHECK(done[0].status() == Status::worker_lost);
  CHECK(done[2].status() == Status::worker_lost);
  CHECK(t[s0].place == SlotPlace::kFree);
  CHECK(t[s2].place == SlotPlace::kFree);
  // b's retry keeps its flight: the pending one stays behind it.
  CHECK(promoted.empty());
  CHECK(t[p].place == SlotPlace::kPending);
  CHECK(t.in_flight(detail::record_of(b)->key_id));
  // The retries go ahead of what waited.
  t.requeue_retries(retried);
  CHECK(t.waiting() == std::vector<uint32_t>{s1, s3, w});
  CHECK(t[s3].place == SlotPlace::kQueued);
  // Nothing is left with the dead worker.
  Ended again;
  CHECK(t.settle(policy_fate(policy, d, false), &again, &promoted).empty());
  CHECK(again.empty());
}

TEST_CASE("slot table: an overrun death ends the one that overran killed, and shutdown ends all") {
  Scripts scripts;
  Script a = scripts.get("a");
  RestartConfig config;
  config.timeout = std::chrono::milliseconds(100);
  config.grace = std::chrono::milliseconds(50);
  RestartPolicy policy(0, config);
  SlotTable t;
  std::vector<Done> done(3);
  const uint32_t s0 = send(t, a, done[0]);
  const uint32_t s1 = send(t, a, done[1]);
  Death d;
  d.cause = DeathCause::kOverrun;
  d.overrun_id = t.id(s1);
  d.running = t.id(s1);
  Ended ended;
  std::vector<uint32_t> promoted;
  CHECK(t.settle(policy_fate(policy, d, false), &ended, &promoted) == std::vector<uint32_t>{s0});
  REQUIRE(ended.size() == 1);
  CHECK(ended[0].second.status == Status::killed);
  t.requeue_retries({s0});
  // Shutdown: whatever it had ends cancelled, none is retried.
  ended.clear();
  REQUIRE(t.take_waiting() == std::vector<uint32_t>{s0});
  t.mark_sent(s0, SentWith::kId);
  const uint32_t s2 = send(t, a, done[2]);
  CHECK(t.settle(policy_fate(policy, d, true), &ended, &promoted).empty());
  REQUIRE(ended.size() == 2);
  CHECK(ended[0].second.status == Status::cancelled);
  CHECK(ended[1].second.status == Status::cancelled);
  CHECK(t[s2].place == SlotPlace::kFree);
  CHECK(t.in_use() == 0);
}

TEST_CASE("slot table: ending what waits - all of it, or those a verdict picks, in order") {
  Scripts scripts;
  Script a = scripts.get("a"), b = scripts.get("b");
  SlotTable t;
  std::vector<Done> done(5);
  const uint32_t w0 = t.admit(a, {}, done[0].completion(), SlotPlace::kQueued, false);
  const uint32_t w1 = t.admit(b, {}, done[1].completion(), SlotPlace::kQueued, true);
  const uint32_t w2 = t.admit(a, {}, done[2].completion(), SlotPlace::kQueued, false);
  Completion replaced;
  const uint32_t p = t.admit_pending(b, {}, done[3].completion(), &replaced);
  Ended ended;
  std::vector<uint32_t> promoted;
  // Those of b (a quarantine, say) end; a's stay, in order. Ending b's frees its flight: the
  // pending one is promoted, for the caller to place.
  t.end_waiting_if(
      [&](const Slot& s) -> std::optional<Result> {
        if (detail::record_of(s.script) != detail::record_of(b)) return std::nullopt;
        return Result{Status::runtime_error, {}, "quarantined", 0};
      },
      &ended, &promoted);
  REQUIRE(ended.size() == 1);
  CHECK(ended[0].second.status == Status::runtime_error);
  CHECK(t[w1].place == SlotPlace::kFree);
  CHECK(t.waiting() == std::vector<uint32_t>{w0, w2});
  CHECK(promoted == std::vector<uint32_t>{p});
  CHECK(t[p].place == SlotPlace::kSending);
  t.park(p);
  // A crash loop or shutdown: all of them, in order.
  ended.clear();
  promoted.clear();
  t.end_waiting(Result{Status::unavailable, {}, "crash loop", 0}, &ended, &promoted);
  REQUIRE(ended.size() == 3);
  for (auto& e : ended) CHECK(e.second.status == Status::unavailable);
  CHECK(t.waiting_count() == 0);
  CHECK(t.in_use() == 0);
  CHECK_FALSE(t.in_flight(detail::record_of(b)->key_id));
}
