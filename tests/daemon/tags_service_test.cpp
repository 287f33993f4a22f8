// outrund's TagsService (host/daemon/tags_service.h) without a daemon: an engine over an
// in-process runner, its two threads and their queues. What a job is blocked on is released by
// the test; every wait is on observable state. The tags frames end to end: tags_daemon_test.cpp,
// tags_bounds_test.cpp.
#include "tags_service.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "outrun/in_process.h"

using namespace outrun;
using namespace outrun::daemon;

namespace {

// A service started over an in-process runner (no tags file, no state store).
struct Started {
  DaemonConfig cfg;
  InProcess runner;
  TagsService tags{cfg};
  explicit Started(std::size_t reads_per_client = 4) {
    cfg.max_tag_reads_per_client = reads_per_client;
    REQUIRE(tags.start(runner, [this](Request rq, Callback done) {
      runner.evaluate(rq.script, std::move(rq.inputs), std::move(done));
    }) == 0);
  }
};

// Waits (bounded only by the test's timeout) until `f` holds.
template <class F>
void wait_until(F f) {
  while (!f()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace

TEST_CASE("TagsService: the tags thread's queue holds kMaxJobs, then refuses") {
  Started s;
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> started{0}, ran{0};
  // The first job holds the thread; what follows waits in the queue.
  REQUIRE(s.tags.post_job([&] {
    started = 1;
    gate.wait();
    ++ran;
  }));
  wait_until([&] { return started.load() == 1; });
  for (std::size_t i = 0; i < TagsService::kMaxJobs; ++i) REQUIRE(s.tags.post_job([&] { ++ran; }));
  CHECK(!s.tags.post_job([&] { ++ran; }));  // Busy: the queue is full
  release.set_value();
  const int queued = static_cast<int>(TagsService::kMaxJobs) + 1;
  wait_until([&] { return ran.load() >= queued; });
  CHECK(s.tags.post_job([&] { ++ran; }));  // room again
  wait_until([&] { return ran.load() >= queued + 1; });
  CHECK(ran.load() == queued + 1);
}

TEST_CASE("TagsService: reads wait per connection in turn, max_tag_reads_per_client each") {
  Started s(2);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> started{0};
  std::vector<uint64_t> order;  // the read thread's only, read after it is idle
  REQUIRE(s.tags.post_read(1, [&] {
    started = 1;
    gate.wait();
    order.push_back(1);
  }));
  wait_until([&] { return started.load() == 1; });
  CHECK(s.tags.post_read(1, [&] { order.push_back(1); }));
  CHECK(s.tags.post_read(1, [&] { order.push_back(1); }));
  CHECK(!s.tags.post_read(1, [&] { order.push_back(1); }));  // its two are waiting
  CHECK(s.tags.post_read(2, [&] { order.push_back(2); }));   // another connection's are not
  CHECK(s.tags.reads_waiting() == 4);  // the drain waits for the one running too
  release.set_value();
  wait_until([&] { return s.tags.reads_waiting() == 0; });
  // Connection 2's read took its turn between connection 1's.
  CHECK(order == std::vector<uint64_t>{1, 1, 2, 1});
}

TEST_CASE("TagsService: after stop nothing is queued, and stop is once") {
  Started s;
  CHECK(s.tags.running());
  CHECK(!s.tags.stopping());
  s.tags.stop();
  CHECK(s.tags.stopping());
  CHECK(!s.tags.running());  // the engine is gone (before the Host it ran on)
  CHECK(!s.tags.post_job([] { FAIL("ran after stop"); }));
  CHECK(!s.tags.post_read(1, [] { FAIL("ran after stop"); }));
  CHECK(s.tags.reads_waiting() == 0);
  s.tags.request_reload();  // a SIGHUP while stopping: nothing runs it, nothing breaks
  s.tags.stop();
}

TEST_CASE("TagsService: a SIGHUP with no tags file is covered at once") {
  Started s;
  s.tags.note_sighup();
  s.tags.note_sighup();
  const TagsService::ReloadStats r = s.tags.reload_stats();
  CHECK(r.requested == 2);
  CHECK(r.covered == 2);
  CHECK(r.ok);
  CHECK(r.errors.empty());
}
