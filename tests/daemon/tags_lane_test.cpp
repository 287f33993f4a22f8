// The tags lane (design/daemon.md "Tags lane", D-tags-lane): the tags engine's evaluations wait
// in the daemon's fair scheduler as one lane of each shard's ring, so waves of tags take turns
// with the clients instead of queueing in the Host ahead of them (issue 29, item 9).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon_support.h"
#include "outrun/tags.h"

namespace {

using namespace std::chrono_literals;
using namespace outrun::test;
namespace tags = outrun::tags;

tags::SourceUpdate source(const std::string& tag, double v) {
  tags::SourceUpdate u;
  u.tag = tag;
  u.value.value = outrun::Value(v);
  u.value.status = tags::codes::Good;
  return u;
}

}  // namespace

TEST_CASE("outrund tags lane: tag waves take turns with an honest client's evaluations") {
  Daemon d({"--timeout", "5000"});
  auto admin = d.client();
  // kTags independent tags of ~5 ms each, over a source each: every update of all the sources is
  // a wave of kTags evaluations, about half of them on each shard.
  constexpr int kTags = 60;
  std::ostringstream toml;
  std::vector<tags::SourceUpdate> all;
  for (int i = 0; i < kTags; ++i) {
    const std::string n = std::to_string(i);
    toml << "[[tag]]\nid = \"t" << n << "\"\ninputs = [\"s" << n
         << "\"]\nscript = \"local t = os.clock() while os.clock() - t < 0.005 do end return "
            "inputs.s"
         << n << "\"\n\n";
    all.push_back(source("s" + n, 0));
  }
  REQUIRE(!admin->define_tags(toml.str(), false));
  REQUIRE(!admin->update_sources(all));  // an admin makes the sources

  auto honest = d.client();
  outrun::Script quick;
  REQUIRE(!honest->register_script("quick", "return 1", &quick));
  auto watcher = d.client();
  // The evaluations the honest script's shard has ended (the Host's count: the tags' and the
  // honest client's alike).
  auto shard_evaluations = [&] {
    std::string s;
    REQUIRE(!watcher->stats_json(&s));
    return nlohmann::json::parse(s)["shards"][quick.shard()]["evaluations"].get<uint64_t>();
  };

  // The flood: updates of every source, again and again, each a new value.
  auto flooder = d.client();
  std::atomic<bool> stop{false};
  std::atomic<int> update_errors{0};
  std::thread flood([&] {
    double v = 1;
    while (!stop.load()) {
      for (auto& u : all) u.value.value = outrun::Value(v);
      if (flooder->update_sources(all)) ++update_errors;
      v += 1;
      std::this_thread::sleep_for(1ms);
    }
  });
  const uint64_t start = shard_evaluations();
  for (int i = 0; i < 1000 && shard_evaluations() < start + kTags; ++i)
    std::this_thread::sleep_for(10ms);

  // How many evaluations the shard ended while each honest evaluation waited: the scheduler's
  // turns, not the wall clock. In the lane, the tags get a client's share: the honest
  // evaluation waits for what is in the shard's window (W = 2 for 5 ms evaluations) and at most
  // one turn of the lane (W again). Ahead of the scheduler, it waited behind every tag of the
  // wave queued in the Host (~kTags / 2).
  constexpr int kRounds = 30;
  std::vector<uint64_t> waited;
  for (int i = 0; i < kRounds; ++i) {
    const uint64_t before = shard_evaluations();
    const outrun::Result r = honest->evaluate(quick, {}).get();
    const uint64_t after = shard_evaluations();
    CHECK(r.status == outrun::Status::ok);
    waited.push_back(after - before - 1);  // not its own
  }
  stop = true;
  flood.join();
  CHECK(update_errors.load() == 0);
  std::string list;
  for (uint64_t w : waited) list += std::to_string(w) + " ";
  std::sort(waited.begin(), waited.end());
  const uint64_t median = waited[kRounds / 2];
  MESSAGE("tag evaluations ended while the honest one waited (sorted): " << list << "median "
                                                                         << median);
  // The counts also take in what ended during the two stats round trips around each wait: on a
  // loaded machine (ASan, a build beside it) the median was 7 once. Ahead of the lane it is ~30.
  CHECK(median <= 12);
  CHECK(waited[kRounds * 9 / 10] <= 20);
  CHECK(d.stop() == 0);
}
