// The slot table alone (no host, no worker): admission, single flight and coalescing, release
// and promotion, stale ids, what was sent when a worker dies.
#include "slot_table.h"

#include <doctest/doctest.h>

#include <memory>
#include <optional>

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
  const uint32_t i = t.admit(a, {}, d1.completion(), SlotPlace::kSent, false);
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
  Done d2;
  const uint32_t j = t.admit(a, {}, d2.completion(), SlotPlace::kSent, false);
  CHECK(j == i);
  CHECK(t.id(j) != id);
  CHECK(t.sent(id) == nullptr);
  CHECK(t.sent(t.id(j)) == &t[j]);
  // Forged ids: out of range, never sent.
  CHECK(t.sent(uint64_t{1} << 32 | 999) == nullptr);
  Done d3;
  const uint32_t w = t.admit(a, {}, d3.completion(), SlotPlace::kWaiting, false);
  CHECK(t.sent(t.id(w)) == nullptr);
  CHECK(t.waiting_count() == 1);
}

TEST_CASE("slot table: single flight holds the key until the evaluation ends") {
  Scripts scripts;
  Script a = scripts.get("a"), b = scripts.get("b");
  SlotTable t;
  Done d1, d2;
  CHECK_FALSE(t.in_flight(a.record()->key_id));
  const uint32_t i = t.admit(a, {}, d1.completion(), SlotPlace::kSent, true);
  CHECK(t.in_flight(a.record()->key_id));
  CHECK_FALSE(t.in_flight(b.record()->key_id));
  t.admit(b, {}, d2.completion(), SlotPlace::kWaiting, true);
  CHECK(t.in_flight(b.record()->key_id));
  std::vector<uint32_t> promoted;
  t.release(i, &promoted);
  CHECK_FALSE(t.in_flight(a.record()->key_id));
  // Without single flight the key is never taken.
  Done d3;
  t.admit(a, {}, d3.completion(), SlotPlace::kSent, false);
  CHECK_FALSE(t.in_flight(a.record()->key_id));
}

TEST_CASE("slot table: coalesce-latest keeps one waiting behind the flight and promotes it") {
  Scripts scripts;
  Script a = scripts.get("a");
  SlotTable t;
  Done first, second, third;
  const uint32_t i = t.admit(a, {}, first.completion(), SlotPlace::kSent, true);
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
  CHECK(t[p3].place == SlotPlace::kWaiting);
  CHECK(t.in_flight(a.record()->key_id));
  // Ending the promoted one frees the flight (it is not mistaken for a pending one).
  std::vector<uint32_t> none;
  finish(t.release(p3, &none), Status::ok);
  CHECK(none.empty());
  CHECK_FALSE(t.in_flight(a.record()->key_id));
}

TEST_CASE("slot table: what was sent when a worker dies, the waiting queue in order") {
  Scripts scripts;
  Script a = scripts.get("a");
  SlotTable t;
  std::vector<Done> done(5);
  std::vector<uint32_t> sent;
  for (int k = 0; k < 3; ++k)
    sent.push_back(t.admit(a, {}, done[k].completion(), SlotPlace::kSent, false));
  const uint32_t w1 = t.admit(a, {}, done[3].completion(), SlotPlace::kWaiting, false);
  CHECK(t.take_sent() == sent);
  Ended ended;
  std::vector<uint32_t> promoted;
  t.end(sent[1], Result{Status::worker_lost, {}, "gone", 0}, &ended, &promoted);
  REQUIRE(ended.size() == 1);
  CHECK(ended[0].second.status == Status::worker_lost);
  CHECK(t.take_sent() == std::vector<uint32_t>{sent[0], sent[2]});
  t.park(sent[2]);  // a retry
  CHECK(t.waiting() == std::vector<uint32_t>{w1, sent[2]});
  CHECK(t.take_waiting() == std::vector<uint32_t>{w1, sent[2]});
  CHECK(t.waiting_count() == 0);
  CHECK(t.take_sent() == std::vector<uint32_t>{sent[0]});
}
