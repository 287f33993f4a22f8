// The tags' state store through the real daemon (design/daemon.md "State store"): keep_state
// and last values survive kill -9 and SIGTERM of outrund, a damaged store is survived and said,
// a removed tag's row goes, a restored value is UncertainLastUsableValue until evaluated.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "daemon_support.h"
#include "outrun/tags.h"

namespace {

using namespace std::chrono_literals;
using namespace outrun::test;
namespace tags = outrun::tags;
namespace fs = std::filesystem;

// A totalizer: it must keep counting across restarts. The state's key is one the tests find in
// the file to damage it.
const char* kTotalizer = R"(
[[tag]]
id = "total"
type = "Double"
inputs = ["pulses"]
keep_state = true
script = '''
state.pulse_total_xyzzy = (state.pulse_total_xyzzy or 0) + inputs.pulses
return state.pulse_total_xyzzy
'''

[[tag]]
id = "twice"
type = "Double"
inputs = ["pulses"]
script = "return inputs.pulses * 2"
)";

tags::SourceUpdate good(const std::string& tag, double v) {
  tags::SourceUpdate u;
  u.tag = tag;
  u.value.value = outrun::Value(v);
  u.value.status = tags::codes::Good;
  return u;
}

tags::DataValue read_one(outrun::Client& c, const std::string& id) {
  std::vector<tags::Change> out;
  const outrun::Error e = c.read_tags({id}, &out);
  INFO(e.message);
  REQUIRE(!e);
  REQUIRE(out.size() == 1);
  return out[0].value;
}

// Polls `id` until it is Good with `v` (10 s).
bool wait_good(outrun::Client& c, const std::string& id, double v) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    const tags::DataValue dv = read_one(c, id);
    if (dv.status == tags::codes::Good && dv.value.is<double>() && dv.value.as<double>() == v)
      return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

// Sends the pulses first, first + 1, ... last, each once the total has counted the one before
// (updates sent at once would be merged into one wave), ending at `expect_total`.
void pulse(outrun::Client& c, double first, double last, double expect_total) {
  double total = expect_total;
  for (double p = first; p <= last; ++p) total -= p;
  for (double p = first; p <= last; ++p) {
    REQUIRE(!c.update_sources({good("pulses", p)}));
    total += p;
    REQUIRE(wait_good(c, "total", total));
  }
}

struct StateDir {
  std::string path = temp_dir();
  ~StateDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file() const { return path + "/tags-state.sqlite"; }
};

std::vector<std::string> state_args(const StateDir& s, const char* flush_ms = "20") {
  return {"--state-dir", s.path, "--state-flush-ms", flush_ms};
}

nlohmann::json listed(outrun::Client& c, const std::string& id) {
  std::string json;
  REQUIRE(!c.list_tags_json(&json));
  const nlohmann::json doc = nlohmann::json::parse(json);
  for (const auto& t : doc["tags"])
    if (t["id"] == id) return t;
  FAIL("tag not listed: " << id);
  return {};
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("outrund state store: a keep_state totalizer keeps counting across kill -9") {
  StateDir s;
  {
    Daemon d(state_args(s));
    auto c = d.client();
    REQUIRE(!c->define_tags(kTotalizer, false));
    pulse(*c, 1, 3, 6);  // 1 + 2 + 3
    REQUIRE(wait_good(*c, "twice", 6));
    std::this_thread::sleep_for(300ms);  // > state_flush_ms: committed
    d.process.kill_now();                // SIGKILL: no shutdown, no flush
    d.pid = -1;
  }
  Daemon d(state_args(s));
  auto c = d.client();
  REQUIRE(!c->define_tags(kTotalizer, false));
  // Restored: the last value, UncertainLastUsableValue, its source timestamp kept, until the
  // tag is evaluated again.
  for (const char* id : {"total", "twice"}) {
    CAPTURE(id);
    const tags::DataValue dv = read_one(*c, id);
    CHECK(dv.status == tags::codes::UncertainLastUsableValue);
    REQUIRE(dv.value.is<double>());
    CHECK(dv.value.as<double>() == 6.0);
    CHECK(dv.source_time != outrun::DateTime{});
  }
  pulse(*c, 4, 4, 10);  // state came back: 6 + 4
  CHECK(wait_good(*c, "twice", 8));
  CHECK(listed(*c, "total")["counters"]["state_store"] == "");
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund state store: SIGTERM commits what the flush interval still held") {
  StateDir s;
  {
    Daemon d(state_args(s, "60000"));  // nothing is committed before the stop
    auto c = d.client();
    REQUIRE(!c->define_tags(kTotalizer, false));
    pulse(*c, 1, 2, 3);
    CHECK(d.stop() == 0);
  }
  REQUIRE(fs::exists(s.file()));
  Daemon d(state_args(s));
  auto c = d.client();
  REQUIRE(!c->define_tags(kTotalizer, false));
  CHECK(read_one(*c, "total").status == tags::codes::UncertainLastUsableValue);
  pulse(*c, 3, 3, 6);
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund state store: a damaged row or file is survived, the tags start from {}") {
  for (const std::string damage : {"garbled row", "truncated file", "not SQLite"}) {
    CAPTURE(damage);
    StateDir s;
    {
      Daemon d(state_args(s));
      auto c = d.client();
      REQUIRE(!c->define_tags(kTotalizer, false));
      pulse(*c, 1, 3, 6);
      CHECK(d.stop() == 0);  // the WAL is checkpointed into the file
    }
    std::string bytes = read_all(s.file());
    REQUIRE(bytes.size() > 1024);
    const std::string& what = damage;
    if (what == "garbled row") {
      // The state's key, wherever a copy is: the row's checksum no longer matches.
      std::size_t found = 0;
      for (auto at = bytes.find("pulse_total_xyzzy"); at != std::string::npos;
           at = bytes.find("pulse_total_xyzzy", at + 1), ++found)
        bytes[at + 3] = 'X';
      REQUIRE(found > 0);
    } else if (what == "truncated file") {
      bytes.resize(bytes.size() / 2 + 100);
    } else {
      bytes.assign(bytes.size(), 'g');
    }
    std::ofstream(s.file(), std::ios::binary | std::ios::trunc) << bytes;

    const std::string log = s.path + "/outrund.log";
    auto args = state_args(s);
    args.insert(args.end(), {"--log-file", log});
    Daemon d(args);
    auto c = d.client();
    REQUIRE(!c->define_tags(kTotalizer, false));
    const tags::DataValue dv = read_one(*c, "total");
    CHECK(dv.status == tags::codes::BadWaitingForInitialData);
    CHECK(dv.diagnostics.find("state store") != std::string::npos);
    const nlohmann::json t = listed(*c, "total");
    const std::string note = t["counters"]["state_store"];
    CHECK(note.find("starts from {}") != std::string::npos);
    pulse(*c, 5, 5, 5);  // from {}
    CHECK(d.stop() == 0);
    const std::string text = read_all(log);
    if (what == "garbled row") {
      CHECK(note.find("checksum") != std::string::npos);
      CHECK(text.find("checksum mismatch") != std::string::npos);
    } else {
      CHECK(note.find("moved to") != std::string::npos);
      CHECK(text.find("moved aside") != std::string::npos);
      bool aside = false;
      for (const auto& e : fs::directory_iterator(s.path))
        aside |= e.path().filename().string().rfind("tags-state.sqlite.corrupt-", 0) == 0;
      CHECK(aside);
    }
  }
}

TEST_CASE("outrund state store: removing a tag removes its stored state") {
  StateDir s;
  {
    Daemon d(state_args(s));
    auto c = d.client();
    REQUIRE(!c->define_tags(kTotalizer, false));
    pulse(*c, 1, 3, 6);
    std::this_thread::sleep_for(200ms);
    REQUIRE(!c->remove_tags({"total"}));
    std::this_thread::sleep_for(300ms);
    d.process.kill_now();
    d.pid = -1;
  }
  Daemon d(state_args(s));
  auto c = d.client();
  REQUIRE(!c->define_tags(kTotalizer, false));
  // Not restored: never evaluated since, and no state.
  CHECK(read_one(*c, "total").status == tags::codes::BadWaitingForInitialData);
  CHECK(read_one(*c, "twice").status == tags::codes::UncertainLastUsableValue);  // kept
  pulse(*c, 7, 7, 7);
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund state store: a tag over max_state_store_bytes is not stored, and says so") {
  StateDir s;
  const std::string conf = s.path + "/outrund.toml";
  std::ofstream(conf) << "[daemon]\nmax_state_store_bytes = 4096\n";
  const char* big = R"(
[[tag]]
id = "big"
type = "Double"
inputs = ["pulses"]
keep_state = true
script = '''
state.pad = string.rep("x", 8000)
return inputs.pulses
'''
)";
  {
    auto args = state_args(s);
    args.insert(args.end(), {"--config", conf});
    Daemon d(args);
    auto c = d.client();
    REQUIRE(!c->define_tags(big, false));
    REQUIRE(!c->update_sources({good("pulses", 1)}));
    REQUIRE(wait_good(*c, "big", 1));
    std::string note;
    for (int i = 0; i < 500 && note.empty(); ++i) {
      note = listed(*c, "big")["counters"]["state_store"];
      std::this_thread::sleep_for(10ms);
    }
    CHECK(note.find("max_state_store_bytes") != std::string::npos);
    CHECK(d.stop() == 0);
  }
}
