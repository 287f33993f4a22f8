// outrund's script table (host/daemon/script_table.h) over a real Host's records: entries by id
// and key, generations, replacement, unregistering, and the per-uid charges that follow them.
// The daemon's use of it (handles on the wire, tenancy, quotas) is tested in daemon_test.cpp
// and tenancy_test.cpp.
#include "script_table.h"

#include <doctest/doctest.h>

#include <memory>

#include "outrun/host.h"

using outrun::Error;
using outrun::Host;
using outrun::HostOptions;
using outrun::Script;
using outrun::daemon::kHandleIdBits;
using outrun::daemon::RegistryQuota;
using outrun::daemon::ScriptEntry;
using outrun::daemon::ScriptTable;

namespace {

std::unique_ptr<Host> one_shard_host() {
  HostOptions o;
  o.shards = 1;
  o.worker_path = OUTRUN_TEST_WORKER;
  std::unique_ptr<Host> host;
  const Error err = Host::create(o, &host);
  REQUIRE_MESSAGE(!err, err.message);
  return host;
}

Script reg(Host& h, const char* key, const char* source) {
  Script s;
  const Error err = h.register_script(key, source, &s);
  REQUIRE_MESSAGE(!err, err.message);
  return s;
}

}  // namespace

TEST_CASE("ScriptTable: a key's new source replaces its entry and moves the charge") {
  auto host = one_shard_host();
  ScriptTable t(RegistryQuota(1 << 20, 10));
  const Script a = reg(*host, "k", "return 1");
  const std::shared_ptr<ScriptEntry> ea = t.at(a.id());
  CHECK(ea == nullptr);  // nothing recorded yet
  ScriptEntry& first = t.record(a, 7, 100);
  CHECK(first.gen == 0);
  CHECK(first.uid == 7);
  CHECK(ScriptTable::handle_of(first) == a.id());
  CHECK(t.live() == 1);
  CHECK(t.quota().usage(7).bytes == 100);
  CHECK(t.current("k") == &first);
  // The same record again (another Register of the same source): its entry, owner and charge.
  CHECK(&t.record(a, 8, 0) == &first);
  CHECK(first.uid == 7);
  CHECK(t.live() == 1);
  CHECK(t.quota().usage(8).bytes == 0);

  const std::shared_ptr<ScriptEntry> kept = t.at(a.id());  // as an evaluation in flight holds it
  const Script b = reg(*host, "k", "return 2");
  ScriptEntry& second = t.record(b, 8, 50);
  CHECK(kept->replaced);
  CHECK(!kept->script.valid());
  CHECK(t.live() == 1);
  CHECK(t.quota().usage(7).bytes ==
        0);  // released: a record no handle reaches is charged to nobody
  CHECK(t.quota().usage(8).bytes == 50);
  CHECK(t.current("k") == &second);
  REQUIRE(t.keys().count("k") == 1);
  CHECK(t.keys().find("k")->second.size() == 1);

  t.forget_key("k");  // Unregister
  CHECK(t.live() == 0);
  CHECK(t.current("k") == nullptr);
  CHECK(t.keys().empty());
  CHECK(t.quota().usage(8).bytes == 0);
  REQUIRE(t.at(b.id()) != nullptr);  // the entry stays for its message ("unregistered")
  CHECK(!t.at(b.id())->replaced);
  CHECK(!t.at(b.id())->script.valid());
  t.drop(second);  // dropped already: nothing changes
  CHECK(t.live() == 0);
  t.forget_key("k");  // unknown now: nothing
  CHECK(t.at(1u << 21) == nullptr);
}

TEST_CASE("ScriptTable: a reused record id takes the next generation") {
  auto host = one_shard_host();
  ScriptTable t(RegistryQuota(1 << 20, 10));
  uint32_t id = 0;
  {
    Script a = reg(*host, "first", "return 1");
    id = a.id();
    t.record(a, 1, 10);
    t.forget_key("first");
    REQUIRE(!host->unregister_script("first"));
  }  // the record is freed: its id may be given to the next one
  const Script b = reg(*host, "second", "return 2");
  ScriptEntry& e = t.record(b, 1, 10);
  if (b.id() == id) {
    CHECK(e.gen == 1);
    CHECK(ScriptTable::handle_of(e) == (uint64_t{1} << kHandleIdBits | id));
  } else {
    CHECK(e.gen == 0);  // a fresh id
  }
  CHECK(t.live() == 1);
  CHECK(t.quota().usage(1).bytes == 10);
}
