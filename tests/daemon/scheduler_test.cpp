// outrund's Scheduler (host/daemon/scheduler.h) without a daemon or a Host: a fake Host records
// each fill (one Host call) and the test completes them with the service time it chooses. The
// daemon's scheduling end to end: daemon_test.cpp ("fair", "held"), tags_lane_test.cpp.
#include "scheduler.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

#include "conn.h"
#include "script_table.h"

using namespace outrun;
using namespace outrun::daemon;

namespace {

// The Host as the Scheduler sees it: the fills it was handed, in order.
struct FakeHost {
  std::deque<std::shared_ptr<Run>> runs;
  std::vector<std::shared_ptr<Conn>> held;
  Scheduler make(int shards, std::size_t budget) {
    return Scheduler(
        shards, budget,
        [this](std::vector<Request> batch, std::shared_ptr<Run> run) {
          REQUIRE(batch.size() == run->items.size());
          runs.push_back(std::move(run));
        },
        [this](const std::shared_ptr<Conn>& c) { held.push_back(c); });
  }
};

std::shared_ptr<Conn> client(Scheduler& s, uint64_t id, int fd = -1) {
  auto c = std::make_shared<Conn>(nullptr, fd, id);
  c->sched = s.make_queues();
  return c;
}

// `n` evaluations of `c` for shard 0, as one frame queues them.
void queue(Scheduler& s, Conn& c, const std::shared_ptr<ScriptEntry>& e, uint32_t n) {
  loop_thread.assert_here();
  for (uint32_t i = 0; i < n; ++i) s.admit(0, Queued{Request{}, e, i, 0, 0});
  s.queue_admitted(c);
}

// Completes every item of every fill in order, each taking `service_us` of the worker's time
// (the fills they make too), until none is left or `most` are done.
struct Clock {
  uint64_t last = 0;
};
std::size_t complete_all(Scheduler& s, FakeHost& h, Clock& clock, uint64_t service_us,
                         std::size_t most = ~std::size_t{0}) {
  std::size_t done = 0;
  while (!h.runs.empty() && done < most) {
    std::shared_ptr<Run> run = h.runs.front();
    h.runs.pop_front();
    for (std::size_t i = 0; i < run->items.size(); ++i) {
      clock.last = std::max(clock.last, run->sent_us) + service_us;
      const Done d{run->sent_us, clock.last, true};
      s.refill(run->shard, &d);
      ++done;
    }
  }
  return done;
}

// The clients of a fill's items, in order, one per run of the same client.
std::vector<uint64_t> turns(const Run& run) {
  std::vector<uint64_t> out;
  for (const RunItem& it : run.items)
    if (out.empty() || out.back() != it.conn->id) out.push_back(it.conn->id);
  return out;
}

}  // namespace

TEST_CASE("Scheduler: the window follows the shard's service time, within its bounds") {
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  FakeHost h;
  Scheduler s = h.make(1, 1 << 20);
  const auto e = std::make_shared<ScriptEntry>();
  auto a = client(s, 1);
  CHECK(s.window(0).size == kWindowMin);  // until a completion says how long one takes
  queue(s, *a, e, 100000);
  s.refill_due();
  REQUIRE(h.runs.size() == 1);
  CHECK(h.runs.front()->items.size() == kWindowMin);
  Clock clock;
  // Fast evaluations (1 µs): the window grows to its bound, not past it.
  complete_all(s, h, clock, 1, 3000);
  CHECK(s.window(0).size == kWindowMax);
  CHECK(s.window(0).used <= kWindowMax);
  // 100 µs each: kWindowTargetUs / 100 = 20 in flight.
  complete_all(s, h, clock, 100, 3000);
  CHECK(s.window(0).size == 20);
  // Slow ones (1 s): the window shrinks to its floor.
  complete_all(s, h, clock, 1'000'000, 300);
  CHECK(s.window(0).size == kWindowMin);
  CHECK(s.window(0).used <= kWindowMin);
}

TEST_CASE("Scheduler: clients take turns, kQuantum evaluations each") {
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  FakeHost h;
  Scheduler s = h.make(1, 1 << 20);
  const auto e = std::make_shared<ScriptEntry>();
  auto warm = client(s, 9);
  queue(s, *warm, e, 4000);
  s.refill_due();
  Clock clock;
  // Fast completions widen the window to kWindowMax; what is in flight then ends.
  while (s.window(0).size < kWindowMax) complete_all(s, h, clock, 1, 1);
  s.cancel(*warm);
  complete_all(s, h, clock, 1);
  REQUIRE(s.window(0).used == 0);

  // A deep backlog (a) does not keep b waiting: a frame of each in the same loop turn.
  auto a = client(s, 1), b = client(s, 2);
  queue(s, *a, e, 5 * kQuantum);
  queue(s, *b, e, 2 * kQuantum);
  s.refill_due();
  REQUIRE(h.runs.size() == 1);
  const Run& run = *h.runs.front();
  CHECK(run.items.size() == 7 * kQuantum);  // all of it fits the window: one Host call
  CHECK(turns(run) == std::vector<uint64_t>{1, 2, 1, 2, 1});
  CHECK(std::count_if(run.items.begin(), run.items.begin() + kQuantum,
                      [](const RunItem& it) { return it.conn->id == 1; }) == kQuantum);
  CHECK(s.window(0).queued == 0);
}

TEST_CASE("Scheduler: a closed client's queue is cancelled, the others' go on") {
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  FakeHost h;
  Scheduler s = h.make(2, 1 << 20);
  const auto ea = std::make_shared<ScriptEntry>(), eb = std::make_shared<ScriptEntry>();
  auto a = client(s, 1), b = client(s, 2);
  queue(s, *a, ea, 50);
  queue(s, *b, eb, 50);
  s.refill_due();  // the window (kWindowMin) takes a's first two
  REQUIRE(h.runs.size() == 1);
  CHECK(turns(*h.runs.front()) == std::vector<uint64_t>{1});
  CHECK(s.cancel(*a) == 48);
  CHECK(ea->by_status[static_cast<int>(Status::cancelled)].load() == 48);
  CHECK(s.window(0).queued == 50);
  CHECK(s.window(0).clients == 1);
  CHECK(s.cancel(*a) == 0);  // once
  // a's evaluations in the Host finish; the window goes on with b's alone.
  Clock clock;
  std::vector<uint64_t> seen;
  while (!h.runs.empty()) {
    for (uint64_t id : turns(*h.runs.front())) seen.push_back(id);
    complete_all(s, h, clock, 100, 1);
  }
  CHECK(seen.front() == 1);
  CHECK(std::count(seen.begin(), seen.end(), 1) == 1);
  CHECK(s.window(0).queued == 0);
  CHECK(eb->by_status[static_cast<int>(Status::cancelled)].load() == 0);
}

TEST_CASE("Scheduler: a client over its budget is held, skipped, and fed again on resume") {
  loop_thread.bind_to_current_thread();
  loop_thread.assert_here();
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  REQUIRE(::fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);
  REQUIRE(::fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0);
  FakeHost h;
  constexpr std::size_t kBudget = 1024;
  Scheduler s = h.make(1, kBudget);
  const auto e = std::make_shared<ScriptEntry>();
  auto a = client(s, 1, sv[0]), b = client(s, 2);
  // a does not read what it is sent: its socket fills, its writer queues past the budget.
  const std::vector<uint8_t> blob(64 << 10, 0x5a);
  while (a->writer.queued_bytes() <= kBudget) a->writer.write(blob);
  CHECK(s.over_budget(*a));
  CHECK(s.queued_peak_bytes() > kBudget);
  queue(s, *a, e, 10);
  queue(s, *b, e, 10);
  s.refill_due();
  // The fill passed a by (held, handed to the loop once) and took b's.
  REQUIRE(h.held.size() == 1);
  CHECK(h.held[0] == a);
  CHECK(a->held.load());
  CHECK(s.held_total() == 1);
  REQUIRE(h.runs.size() == 1);
  CHECK(turns(*h.runs.front()) == std::vector<uint64_t>{2});
  Clock clock;
  complete_all(s, h, clock, 100);  // b's, all of them: a is not in the ring
  CHECK(s.window(0).queued == 10);
  CHECK(s.window(0).clients == 0);
  CHECK(!s.hold(*a));  // held already: counted once

  // a reads its socket; its writer drains; the loop resumes it.
  std::vector<uint8_t> sink(1 << 20);
  for (int spins = 0; a->writer.queued_bytes() > 0; ++spins) {
    while (::read(sv[1], sink.data(), sink.size()) > 0) {
    }
    (void)a->writer.flush_from_loop();
    REQUIRE(spins < 100000);
  }
  CHECK(!s.over_budget(*a));
  s.resume(*a);
  CHECK(!a->held.load());
  REQUIRE(!h.runs.empty());
  CHECK(turns(*h.runs.front()) == std::vector<uint64_t>{1});
  complete_all(s, h, clock, 100);
  CHECK(s.window(0).queued == 0);
  ::close(sv[1]);
}
