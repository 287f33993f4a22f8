// The shard reader alone (no worker process, no loop thread): a hand-built Results frame against
// a shard's slot table. A result ends its slot exactly once; an id the shard did not send, or a
// second answer, is a violation that ends nothing (the rest of the frame is not handled); the
// slow lane hears of timeouts; what a reader that is not the loop delivers goes where
// deliver_read says.
#include "shard_reader.h"

#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host_impl.h"
#include "outrun/protocol/messages.h"
#include "script_registry.h"

using namespace outrun;
using namespace outrun::detail;

namespace {

// A Results frame as the reader holds it: copied to 8-aligned storage and verified.
struct ResultsFrame {
  std::vector<uint64_t> storage;
  const flatbuffers::Vector<flatbuffers::Offset<wire::Result>>* items = nullptr;
  // (id, status, int value for Ok)
  struct Item {
    uint64_t id;
    wire::Status status;
    int64_t value;
  };
  explicit ResultsFrame(const std::vector<Item>& list) {
    flatbuffers::FlatBufferBuilder f;
    std::vector<flatbuffers::Offset<wire::Result>> offs;
    for (const Item& it : list) {
      flatbuffers::Offset<wire::Value> v;
      if (it.status == wire::Status::Ok)
        v = wire::CreateValue(f, wire::ValueKind::Int, false, it.value);
      offs.push_back(protocol::build_result(f, it.id, it.status, v,
                                            it.status == wire::Status::Ok ? "" : "k:1: no"));
    }
    const std::span<const uint8_t> bytes = protocol::finish_results(f, offs);
    storage.resize((bytes.size() + 7) / 8);
    std::memcpy(storage.data(), bytes.data(), bytes.size());
    const wire::Frame* frame =
        protocol::verify_frame(reinterpret_cast<const uint8_t*>(storage.data()), bytes.size());
    REQUIRE(frame != nullptr);
    protocol::WorkerMessage m;
    std::string why;
    REQUIRE(protocol::decode_worker_frame(frame, &m, &why));
    items = std::get<protocol::ResultsMsg>(m).items;
  }
};

// A host that never starts (no loop thread, no worker): its reader, and one shard of its own.
struct Bench {
  explicit Bench(bool slow_lane = false) {
    HostOptions o;
    o.shards = 1;
    o.slow_lane = slow_lane;
    impl = std::make_unique<Host::Impl>(o);
    sh = std::make_unique<Shard>(0, impl->loop_role);
  }
  Script script(const char* key) {
    Script s;
    REQUIRE_FALSE(scripts.add(key, "return 1", &s));
    return s;
  }
  // Admitted and written to the (imagined) worker, as submit() does; its result lands in `got`.
  uint64_t send(const Script& s, std::vector<std::optional<Result>>& got, std::size_t i) {
    MutexLock lock(sh->mu);
    const uint32_t idx =
        sh->table.admit(s, {}, Completion(Callback([&got, i](Result r) { got[i] = std::move(r); })),
                        SlotPlace::kSending, false);
    sh->table.mark_sent(idx, SentWith::kId);
    return sh->table.id(idx);
  }
  // The reader handles `frame` as a leader would (holding the token, not on the loop): callbacks
  // come back in `to_dispatch`, delivered here in order.
  std::string handle(const ResultsFrame& frame) {
    std::string violation;
    std::vector<Delivery> to_dispatch;
    sh->reading.token.acquire();
    impl->reader.handle_results(*sh, frame.items, &violation, &to_dispatch);
    sh->reading.token.release();
    for (auto& d : to_dispatch) d.done.deliver(std::move(d.result), impl->log);
    return violation;
  }
  std::size_t in_use() {
    MutexLock lock(sh->mu);
    return sh->table.in_use();
  }

  ScriptRegistry scripts{nullptr, 1, 1u << 20, /*deferred_ids=*/false};
  std::unique_ptr<Host::Impl> impl;
  std::unique_ptr<Shard> sh;
};

}  // namespace

TEST_CASE("shard reader: a good result ends its slot exactly once") {
  Bench b;
  const Script s = b.script("a");
  std::vector<std::optional<Result>> got(2);
  const uint64_t id0 = b.send(s, got, 0);
  const uint64_t id1 = b.send(s, got, 1);
  REQUIRE(b.in_use() == 2);
  CHECK(b.handle(ResultsFrame({{id1, wire::Status::Ok, 7}, {id0, wire::Status::Ok, 5}})) == "");
  REQUIRE(got[0]);
  REQUIRE(got[1]);
  CHECK(got[0]->status == Status::ok);
  CHECK(got[0]->value == Value(int64_t{5}));
  CHECK(got[1]->value == Value(int64_t{7}));
  CHECK(got[1]->shard == 0);
  CHECK(b.in_use() == 0);
  // The same answer again: the slot is free (its generation moved on), nothing ends twice.
  got[0].reset();
  const std::string v = b.handle(ResultsFrame({{id0, wire::Status::Ok, 5}}));
  CHECK(v.find("answered an evaluation it was not running") != std::string::npos);
  CHECK_FALSE(got[0]);
}

TEST_CASE("shard reader: a result for an id the shard did not send is a violation") {
  Bench b;
  const Script s = b.script("a");
  std::vector<std::optional<Result>> got(1);
  const uint64_t id = b.send(s, got, 0);
  SUBCASE("an unknown id ends nothing, and the rest of the frame is not handled") {
    const std::string v =
        b.handle(ResultsFrame({{id + (uint64_t{1} << 32), wire::Status::Ok, 1},  // next generation
                               {id, wire::Status::Ok, 2}}));
    CHECK(v == "answered an evaluation it was not running (id " +
                   std::to_string(id + (uint64_t{1} << 32)) + ")");
    CHECK_FALSE(got[0]);
    CHECK(b.in_use() == 1);  // still the dying worker's: its death settles it
  }
  SUBCASE("a second answer in the same frame: the first ends it, the second is a violation") {
    const std::string v =
        b.handle(ResultsFrame({{id, wire::Status::Ok, 1}, {id, wire::Status::Ok, 2}}));
    CHECK(v.find("answered an evaluation it was not running") != std::string::npos);
    REQUIRE(got[0]);
    CHECK(got[0]->value == Value(int64_t{1}));
    CHECK(b.in_use() == 0);
  }
  SUBCASE("a slot never sent (queued for the next worker) cannot be answered") {
    std::vector<std::optional<Result>> queued(1);
    uint64_t qid;
    {
      MutexLock lock(b.sh->mu);
      const uint32_t idx = b.sh->table.admit(
          s, {}, Completion(Callback([&queued](Result r) { queued[0] = std::move(r); })),
          SlotPlace::kQueued, false);
      qid = b.sh->table.id(idx);
    }
    CHECK(b.handle(ResultsFrame({{qid, wire::Status::Ok, 1}})) != "");
    CHECK_FALSE(queued[0]);
    CHECK(b.in_use() == 2);
  }
}

TEST_CASE("shard reader: a timeout moves its script to the slow lane") {
  Bench b(/*slow_lane=*/true);
  const Script s = b.script("a");
  std::vector<std::optional<Result>> got(1);
  const uint64_t id = b.send(s, got, 0);
  CHECK(b.impl->slow.moves_in() == 0);
  CHECK(b.handle(ResultsFrame({{id, wire::Status::Timeout, 0}})) == "");
  REQUIRE(got[0]);
  CHECK(got[0]->status == Status::timeout);
  CHECK(b.impl->slow.moves_in() == 1);
  CHECK(record_of(s)->slow.load());
}

TEST_CASE("shard reader: a reader that is not the loop fulfils futures itself") {
  Bench b;
  // fulfill_futures_on_loop is the loop's option; callbacks never run on a leader.
  SyncWaiter me(b.sh->reading);
  std::vector<Delivery> to_dispatch;
  b.impl->reader.deliver_read(Completion(&me), Result{Status::ok, Value(int64_t{3}), {}, 0},
                              &to_dispatch);
  CHECK(to_dispatch.empty());
  CHECK(me.ready());
  bool ran = false;
  b.impl->reader.deliver_read(Completion(Callback([&ran](Result) { ran = true; })), Result{},
                              &to_dispatch);
  CHECK_FALSE(ran);
  CHECK(to_dispatch.size() == 1);
}
