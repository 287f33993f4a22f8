// Virtual tags (outrun/tags.h, design/tags.md) through the public API, over Host and InProcess.
#include "outrun/tags.h"

#include <doctest/doctest.h>
#include <pthread.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <thread>

#include "host/host_support.h"
#include "outrun/in_process.h"
#include "test_support.h"

namespace outrun::test {
namespace {

using namespace std::chrono_literals;
using tags::codes::Bad;
using tags::codes::Good;
using tags::codes::Uncertain;

constexpr tags::StatusCode kUncSub = tags::codes::UncertainSubstituteValue;
constexpr tags::StatusCode kBadSensor = tags::codes::BadSensorFailure;

DateTime at(double s) {
  return DateTime::from_unix_seconds(1'800'000'000.0 + s);
}

// Collects changes; thread-safe.
struct Changes {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<tags::Change> all;
  std::vector<std::size_t> batch_sizes;
  void add(const std::vector<tags::Change>& batch) {
    std::lock_guard lock(mu);
    for (const auto& c : batch) all.push_back(c);
    batch_sizes.push_back(batch.size());
    cv.notify_all();
  }
  std::vector<tags::Change> of(const std::string& id) {
    std::lock_guard lock(mu);
    std::vector<tags::Change> r;
    for (const auto& c : all)
      if (c.tag == id) r.push_back(c);
    return r;
  }
  std::size_t count(const std::string& id) { return of(id).size(); }
  void clear() {
    std::lock_guard lock(mu);
    all.clear();
    batch_sizes.clear();
  }
  bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds limit = 20s) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(2ms);
    }
    return true;
  }
};

enum class Kind { host, in_process };

// A runner, an engine over it and the changes it reported.
struct Rig {
  std::unique_ptr<Host> host;
  std::unique_ptr<InProcess> inproc;
  Runner* runner = nullptr;
  Changes changes;
  std::unique_ptr<tags::Engine> engine;
  DateTime clock = at(0);
  std::mutex clock_mu;

  // `more`: changes to the engine's options (a state sink, restored rows).
  explicit Rig(Kind kind, HostOptions ho = {}, bool manual_periodic = true,
               const std::function<void(tags::TagsOptions&)>& more = {}) {
    if (kind == Kind::host) {
      ho.shards = ho.shards ? ho.shards : 2;
      host = start_host(ho);
      runner = host.get();
    } else {
      InProcessOptions io;
      io.timeout = ho.timeout;
      io.memory_limit = ho.memory_limit;
      inproc = std::make_unique<InProcess>(io);
      runner = inproc.get();
    }
    tags::TagsOptions to;
    to.on_change = [this](const std::vector<tags::Change>& b) { changes.add(b); };
    to.clock = [this] {
      std::lock_guard lock(clock_mu);
      return clock;
    };
    to.real_time_periodic = !manual_periodic;
    to.retry_delay = 20ms;
    if (more) more(to);
    Error err = tags::Engine::create(*runner, to, &engine);
    REQUIRE_MESSAGE(!err, err.message);
  }
  void set_clock(DateTime t) {
    std::lock_guard lock(clock_mu);
    clock = t;
  }
  void define(const tags::TagDefinition& d) {
    Error err = engine->define(d);
    REQUIRE_MESSAGE(!err, err.message);
    REQUIRE(engine->wait_idle());
  }
  void update(std::vector<tags::SourceUpdate> u, DateTime t) {
    set_clock(t);
    Error err = engine->update(u, t);
    REQUIRE_MESSAGE(!err, err.message);
    REQUIRE(engine->wait_idle());
  }
  tags::DataValue read(const std::string& id) {
    tags::DataValue dv;
    Error err = engine->read(id, &dv);
    REQUIRE_MESSAGE(!err, err.message);
    return dv;
  }
};

tags::TagDefinition tag(std::string id, std::string script, std::vector<std::string> inputs,
                        tags::DataType type = tags::DataType::Double) {
  tags::TagDefinition d;
  d.id = std::move(id);
  d.script = std::move(script);
  for (auto& i : inputs) {
    tags::InputSpec in;
    in.tag = i;
    d.inputs.push_back(in);
  }
  d.type.type = type;
  return d;
}

tags::SourceUpdate src(std::string id, Value v, tags::StatusCode s = Good, DateTime t = {}) {
  tags::SourceUpdate u;
  u.tag = std::move(id);
  u.value.value = std::move(v);
  u.value.status = s;
  u.value.source_time = t;
  return u;
}

double num(const Value& v) {
  if (v.is<double>()) return v.as<double>();
  if (v.is<int64_t>()) return static_cast<double>(v.as<int64_t>());
  if (v.is<float>()) return v.as<float>();
  FAIL("not a number: " << to_display_string(v));
  return 0;
}

#define FOR_EACH_RUNNER(kind) \
  Kind kind = Kind::host;     \
  SUBCASE("Host") {           \
    kind = Kind::host;        \
  }                           \
  SUBCASE("InProcess") {      \
    kind = Kind::in_process;  \
  }

}  // namespace

TEST_CASE("tags: status codes, severity and the error map") {
  CHECK(tags::severity(Good) == tags::Severity::good);
  CHECK(tags::severity(tags::codes::UncertainLastUsableValue) == tags::Severity::uncertain);
  CHECK(tags::severity(tags::codes::BadTimeout) == tags::Severity::bad);
  CHECK(tags::severity(0xC0000000u) == tags::Severity::bad);
  CHECK(tags::status_code_name(0x80740000u) == "BadTypeMismatch");
  CHECK(tags::status_code_name(0x80AA0000u) == "0x80AA0000");
  tags::StatusCode c = 0;
  CHECK(tags::parse_status_code("BadOutOfRange", &c));
  CHECK(c == 0x803C0000u);
  CHECK(tags::parse_status_code("0x40900000", &c));
  CHECK(c == 0x40900000u);
  CHECK_FALSE(tags::parse_status_code("-1", &c));
  CHECK_FALSE(tags::parse_status_code("Goodish", &c));
  CHECK(tags::status_code_for(Status::runtime_error) == 0x80020000u);
  CHECK(tags::status_code_for(Status::timeout) == 0x800A0000u);
  CHECK(tags::status_code_for(Status::killed) == 0x800A0000u);
  CHECK(tags::status_code_for(Status::memory_limit) == 0x80030000u);
  CHECK(tags::status_code_for(Status::compile_error) == 0x80890000u);
  CHECK(tags::status_code_for(Status::worker_lost) == 0x80040000u);
}

TEST_CASE("tags: coercion to every DataType, with out-of-range values") {
  using tags::DataType;
  auto ok = [](Value in, DataType t, bool array = false) {
    Value out;
    std::string why;
    const auto c = tags::coerce(in, {t, array}, &out, &why);
    CHECK_MESSAGE(c == Good, why);
    return out;
  };
  auto fails = [](Value in, DataType t, tags::StatusCode expect, bool array = false) {
    Value out;
    std::string why;
    CHECK(tags::coerce(in, {t, array}, &out, &why) == expect);
    CHECK(!why.empty());
  };
  CHECK(ok(Value(true), DataType::Boolean) == Value(true));
  fails(Value(1), DataType::Boolean, tags::codes::BadTypeMismatch);
  CHECK(ok(Value(-128), DataType::SByte) == Value(int64_t{-128}));
  fails(Value(128), DataType::SByte, tags::codes::BadOutOfRange);
  CHECK(ok(Value(255), DataType::Byte) == Value(uint64_t{255}));
  fails(Value(-1), DataType::Byte, tags::codes::BadOutOfRange);
  CHECK(ok(Value(32767), DataType::Int16) == Value(int64_t{32767}));
  fails(Value(-32769), DataType::Int16, tags::codes::BadOutOfRange);
  CHECK(ok(Value(65535), DataType::UInt16) == Value(uint64_t{65535}));
  fails(Value(65536), DataType::UInt16, tags::codes::BadOutOfRange);
  CHECK(ok(Value(2.5), DataType::Int32) == Value(int64_t{3}));  // rounded half away from zero
  CHECK(ok(Value(-2.5), DataType::Int32) == Value(int64_t{-3}));
  fails(Value(int64_t{1} << 31), DataType::Int32, tags::codes::BadOutOfRange);
  CHECK(ok(Value(int64_t{4294967295}), DataType::UInt32) == Value(uint64_t{4294967295u}));
  fails(Value(int64_t{4294967296}), DataType::UInt32, tags::codes::BadOutOfRange);
  CHECK(ok(Value(INT64_MIN), DataType::Int64) == Value(int64_t{INT64_MIN}));
  fails(Value(1e19), DataType::Int64, tags::codes::BadOutOfRange);
  CHECK(ok(Value(1.8e19), DataType::UInt64) == Value(uint64_t{18000000000000000000u}));
  fails(Value(-1), DataType::UInt64, tags::codes::BadOutOfRange);
  fails(Value(std::nan("")), DataType::Int64, tags::codes::BadOutOfRange);
  fails(Value("12"), DataType::Int32, tags::codes::BadTypeMismatch);
  CHECK(ok(Value(1.5), DataType::Float) == Value(1.5f));
  fails(Value(1e39), DataType::Float, tags::codes::BadOutOfRange);
  CHECK(ok(Value(3), DataType::Double) == Value(3.0));
  fails(Value(true), DataType::Double, tags::codes::BadTypeMismatch);
  CHECK(ok(Value("x"), DataType::String) == Value("x"));
  fails(Value(Bytes{"\xff"}), DataType::String, tags::codes::BadTypeMismatch);
  fails(Value(1), DataType::String, tags::codes::BadTypeMismatch);
  CHECK(ok(Value(0.0), DataType::DateTime) == Value(DateTime{DateTime::kUnixEpochTicks}));
  CHECK(ok(Value("2026-12-01T10:00:00.000Z"), DataType::DateTime) ==
        Value(DateTime::from_unix_seconds(1796119200.0)));
  fails(Value(1e13), DataType::DateTime, tags::codes::BadOutOfRange);
  fails(Value("yesterday"), DataType::DateTime, tags::codes::BadTypeMismatch);
  // ISO 8601 outside OPC UA's DateTime range is out of range, not a type mismatch.
  fails(Value("1600-12-31T00:00:00Z"), DataType::DateTime, tags::codes::BadOutOfRange);
  fails(Value("0000-01-01T00:00:00Z"), DataType::DateTime, tags::codes::BadOutOfRange);
  fails(Value("1601-01-01T00:30:00+01:00"), DataType::DateTime, tags::codes::BadOutOfRange);
  fails(Value("9999-12-31T23:00:00-02:00"), DataType::DateTime, tags::codes::BadOutOfRange);
  fails(Value("-600-12-31T00:00:00Z"), DataType::DateTime, tags::codes::BadTypeMismatch);
  fails(Value("1600-13-31T00:00:00Z"), DataType::DateTime, tags::codes::BadTypeMismatch);
  CHECK(ok(Value("1601-01-01T00:00:00Z"), DataType::DateTime) == Value(DateTime{0}));
  CHECK(ok(Value("9999-12-31T23:59:59Z"), DataType::DateTime) ==
        Value(DateTime::from_unix_seconds(253402300799.0)));
  CHECK(ok(Value("ab"), DataType::ByteString) == Value(Bytes{"ab"}));
  CHECK(ok(Value(Array{Value(1), Value(2)}), DataType::Int16, true) ==
        Value(Array{Value(int64_t{1}), Value(int64_t{2})}));
  CHECK(ok(Value(Map{}), DataType::Int16, true) == Value(Array{}));
  fails(Value(Array{Value(1), Value(70000)}), DataType::Int16, tags::codes::BadOutOfRange, true);
  fails(Value(5), DataType::Int16, tags::codes::BadTypeMismatch, true);
  CHECK(ok(Value(Map{{"a", Value(1)}}), DataType::Variant) == Value(Map{{"a", Value(1)}}));
}

TEST_CASE("tags: a script's result is coerced to the declared type, end to end") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("I16", "return inputs.X * 1000", {"X"}, tags::DataType::Int16));
  rig.define(tag("U8s", "return {inputs.X, inputs.X + 1}", {"X"}, tags::DataType::Byte));
  {
    auto d = tag("U8a", "return {inputs.X, inputs.X + 1}", {"X"}, tags::DataType::Byte);
    d.type.array = true;
    rig.define(d);
  }
  rig.define(tag("F", "return inputs.X / 3", {"X"}, tags::DataType::Float));
  rig.define(tag("DT", "return now", {"X"}, tags::DataType::DateTime));
  rig.update({src("X", Value(7))}, at(1));
  auto i16 = rig.read("I16");
  CHECK(i16.status == Good);
  CHECK(i16.value == Value(int64_t{7000}));
  CHECK(rig.read("U8s").status == tags::codes::BadTypeMismatch);
  CHECK(rig.read("U8a").value == Value(Array{Value(uint64_t{7}), Value(uint64_t{8})}));
  CHECK(rig.read("F").value == Value(static_cast<float>(7.0 / 3)));
  CHECK(rig.read("DT").value == Value(at(1)));
  rig.update({src("X", Value(40))}, at(2));
  auto r = rig.read("I16");
  CHECK(r.status == tags::codes::BadOutOfRange);
  CHECK(r.value.is_nil());
  CHECK(r.diagnostics.find("Int16") != std::string::npos);
  CHECK(rig.read("U8a").status == Good);
  rig.update({src("X", Value(300))}, at(3));
  CHECK(rig.read("U8a").status == tags::codes::BadOutOfRange);
}

TEST_CASE("tags: the quality matrix (worst severity wins, its code kept) and script overrides") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("Sum", "return (inputs.A or 0) + (inputs.B or 0)", {"A", "B"}));
  rig.define(tag("Forced", "return 1, StatusCode.Uncertain", {"A", "B"}));
  rig.define(tag("ByName", "return 2, 'UncertainSensorNotAccurate'", {"A", "B"}));
  // Scripts that see Bad inputs say so (evaluate_bad_inputs); by default a Bad input is not
  // passed to the script.
  auto helpers = tag("Helpers",
                     "return (is_good(status.A) and 1 or 0) + (is_uncertain(status.A) and 10 or 0) "
                     "+ (is_bad(status.A) and 100 or 0), StatusCode.Good",
                     {"A", "B"});
  helpers.evaluate_bad_inputs = true;
  rig.define(helpers);
  auto nil_bad =
      tag("NilBad", "if is_bad(status.A) then return nil, status.A end return inputs.A", {"A"});
  nil_bad.evaluate_bad_inputs = true;
  rig.define(nil_bad);
  rig.define(tag("BadStatus", "return 1, -5", {"A"}));
  const tags::StatusCode all[] = {Good, kUncSub, kBadSensor};
  double t = 1;
  for (auto sa : all) {
    for (auto sb : all) {
      CAPTURE(tags::status_code_name(sa));
      CAPTURE(tags::status_code_name(sb));
      rig.update({src("A", Value(1.0 + t), sa), src("B", Value(2.0), sb)}, at(t));
      t += 1;
      const auto sum = rig.read("Sum");
      const int worst =
          std::max(static_cast<int>(tags::severity(sa)), static_cast<int>(tags::severity(sb)));
      tags::StatusCode expect = Good;
      if (worst > 0) expect = static_cast<int>(tags::severity(sa)) == worst ? sa : sb;
      CHECK(sum.status == expect);
      if (worst == 2) {  // a Bad input: not evaluated, its code and no value
        CHECK(sum.value.is_nil());
        CHECK(sum.diagnostics.find("not evaluated: input") != std::string::npos);
        CHECK(rig.read("Forced").status == expect);
        CHECK(rig.read("ByName").status == expect);
      } else {
        CHECK(num(sum.value) == doctest::Approx(3.0 + t - 1));
        CHECK(rig.read("Forced").status == Uncertain);
        CHECK(rig.read("ByName").status == tags::codes::UncertainSensorNotAccurate);
      }
      CHECK(num(rig.read("Helpers").value) == (sa == Good ? 1 : sa == kUncSub ? 10 : 100));
      const auto nb = rig.read("NilBad");
      if (sa == kBadSensor) {
        CHECK(nb.status == kBadSensor);
        CHECK(nb.value.is_nil());
      } else {
        CHECK(nb.status == sa);
      }
      CHECK(rig.read("BadStatus").status ==
            (sa == kBadSensor ? kBadSensor : tags::codes::BadInternalError));
    }
  }
  // No inputs status at all: Good.
  rig.define(tag("Const", "return 5", {}));
  CHECK(rig.read("Const").status == Good);
  // A source never updated: BadWaitingForInitialData flows through.
  rig.define(tag("Waits", "return 1", {"Never"}));
  CHECK(rig.read("Waits").status == tags::codes::BadWaitingForInitialData);
}

TEST_CASE("tags: scripts know every StatusCode by name (StatusCode.X and returned names)") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  // Scripts that see their Bad input (A is BadNotConnected).
  auto sees = [&](std::string id, std::string script,
                  tags::DataType type = tags::DataType::Double) {
    auto d = tag(std::move(id), std::move(script), {"A"}, type);
    d.evaluate_bad_inputs = true;
    rig.define(d);
  };
  sees("Arg", "return 1, StatusCode.BadInvalidArgument");
  sees("Oos", "return nil, StatusCode.BadOutOfService");
  sees("Nc", "return nil, StatusCode.BadNotConnected");
  sees("Unc", "return inputs.A, StatusCode.UncertainNoCommunicationLastUsableValue");
  sees("ByName", "return nil, 'BadOutOfService'");
  sees("Missing", "return StatusCode.Nonexistent == nil and 1 or 0");
  sees("MissingGood", "return StatusCode.Nonexistent == nil and 1 or 0, StatusCode.Good");
  sees("Same", "return status.A == StatusCode.BadNotConnected and 1 or 0, StatusCode.Good");
  sees("Old", "return '1600-12-31T00:00:00Z'", tags::DataType::DateTime);
  rig.update({src("A", Value(5.0), tags::StatusCode{0x808A0000})}, at(1));
  CHECK(rig.read("Arg").status == tags::codes::BadInvalidArgument);
  CHECK(rig.read("Oos").status == 0x808D0000u);
  CHECK(tags::status_code_name(rig.read("Oos").status) == "BadOutOfService");
  CHECK(rig.read("Nc").status == 0x808A0000u);
  const auto unc = rig.read("Unc");
  CHECK(unc.status == 0x408F0000u);
  CHECK(num(unc.value) == 5.0);
  CHECK(rig.read("ByName").status == 0x808D0000u);
  const auto missing = rig.read("Missing");
  CHECK(missing.status == 0x808A0000u);  // the input's own code (the status rule)...
  CHECK(missing.value.is_nil());         // ...Bad, so no value
  tags::TagInfo mi;
  REQUIRE(!rig.engine->info("Missing", &mi));
  CHECK(mi.counters.evaluations == 1);  // it ran (evaluate_bad_inputs)
  CHECK(num(rig.read("MissingGood").value) == 1.0);
  CHECK(num(rig.read("Same").value) == 1.0);
  const auto old = rig.read("Old");
  CHECK(old.status == tags::codes::BadOutOfRange);
  CHECK(old.diagnostics.find("1601") != std::string::npos);
}

TEST_CASE("tags: errors map to StatusCodes, with diagnostics") {
  FOR_EACH_RUNNER(kind);
  HostOptions ho;
  ho.timeout = 50ms;
  ho.memory_limit = 4u << 20;
  Rig rig(kind, ho);
  rig.define(tag("Err", "error('boom')", {"X"}));
  rig.define(tag("Loop", "if inputs.X > 1 then while true do end end return 1", {"X"}));
  rig.define(tag("Mem", "local s = string.rep(\"x\", 8 << 20) return #s", {"X"}));
  rig.update({src("X", Value(2))}, at(1));
  auto e = rig.read("Err");
  CHECK(e.status == tags::codes::BadInternalError);
  CHECK(e.diagnostics.find("boom") != std::string::npos);
  CHECK(e.diagnostics.find(":1:") != std::string::npos);  // the user's line
  CHECK(rig.read("Loop").status == tags::codes::BadTimeout);
  CHECK(rig.read("Mem").status == tags::codes::BadOutOfMemory);
  tags::TagInfo info;
  REQUIRE(!rig.engine->info("Err", &info));
  CHECK(info.counters.by_status[static_cast<int>(Status::runtime_error)] >= 1);
  CHECK(info.counters.last_error.find("boom") != std::string::npos);
}

TEST_CASE("tags: timestamp policies") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  auto newest = tag("Newest", "return inputs.A + inputs.B", {"A", "B"});
  auto trig = tag("Trig", "return inputs.A + inputs.B", {"A", "B"});
  trig.timestamps = tags::TimestampPolicy::triggering_input;
  auto evt = tag("Eval", "return inputs.A + inputs.B", {"A", "B"});
  evt.timestamps = tags::TimestampPolicy::evaluation_time;
  rig.define(newest);
  rig.define(trig);
  rig.define(evt);
  rig.update({src("A", Value(1), Good, at(10)), src("B", Value(2), Good, at(20))}, at(30));
  CHECK(rig.read("Newest").source_time == at(20));
  CHECK(rig.read("Newest").server_time == at(30));
  CHECK(rig.read("Trig").source_time == at(20));
  CHECK(rig.read("Eval").source_time == at(30));
  // Only A changes, with an older timestamp than B's.
  rig.update({src("A", Value(5), Good, at(15))}, at(40));
  CHECK(rig.read("Newest").source_time == at(20));
  CHECK(rig.read("Trig").source_time == at(15));
  CHECK(rig.read("Eval").source_time == at(40));
  CHECK(rig.read("Eval").server_time == at(40));
}

TEST_CASE("tags: deadbands (absolute and percent) and listed trigger inputs") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  auto abs = tag("Abs", "return inputs.X", {"X"});
  abs.inputs[0].deadband = tags::DeadbandKind::absolute;
  abs.inputs[0].deadband_value = 0.5;
  auto pct = tag("Pct", "return inputs.X", {"X"});
  pct.inputs[0].deadband = tags::DeadbandKind::percent;
  pct.inputs[0].deadband_value = 10;  // 10 % of the range 0..20 = 2
  pct.inputs[0].range_high = 20;
  auto listed = tag("Listed", "return inputs.X + inputs.Y", {"X", "Y"});
  listed.inputs[1].trigger = false;  // Y is read but does not trigger
  rig.define(abs);
  rig.define(pct);
  rig.define(listed);
  rig.update({src("X", Value(10.0)), src("Y", Value(1.0))}, at(1));
  rig.changes.clear();
  rig.update({src("X", Value(10.4))}, at(2));  // within both
  CHECK(rig.changes.count("Abs") == 0);
  CHECK(rig.changes.count("Pct") == 0);
  rig.update({src("X", Value(10.6))}, at(3));  // |10.6-10| > 0.5, < 2
  CHECK(rig.changes.count("Abs") == 1);
  CHECK(num(rig.read("Abs").value) == doctest::Approx(10.6));
  CHECK(rig.changes.count("Pct") == 0);
  rig.update({src("X", Value(12.1))}, at(4));  // > 2 from 10 (Pct's last used)
  CHECK(rig.changes.count("Pct") == 1);
  CHECK(num(rig.read("Pct").value) == doctest::Approx(12.1));
  // A status change always passes the deadband.
  rig.update({src("X", Value(12.1), kUncSub)}, at(5));
  CHECK(rig.read("Abs").status == kUncSub);
  // Listed inputs: Y alone does not trigger; the next X change sees Y's latest value.
  const auto before = rig.changes.count("Listed");
  rig.update({src("Y", Value(100.0))}, at(6));
  CHECK(rig.changes.count("Listed") == before);
  rig.update({src("X", Value(0.0))}, at(7));
  CHECK(num(rig.read("Listed").value) == doctest::Approx(100.0));
}

TEST_CASE("tags: only a real change notifies, a periodic tag with steady inputs is quiet") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);  // manual clock: advance_clock drives periodic tags
  auto per = tag("Per", "return inputs.X * 2", {"X"});
  per.trigger.kind = tags::TriggerKind::periodic;
  per.trigger.period = 1000ms;
  rig.define(per);
  rig.define(tag("OnChange", "return inputs.X * 3", {"X"}));
  rig.update({src("X", Value(1), Good, at(0))}, at(0));
  rig.engine->advance_clock(at(0));
  REQUIRE(rig.engine->wait_idle());
  const auto first = rig.changes.count("Per");
  CHECK(first >= 1);
  CHECK(num(rig.read("Per").value) == 2);
  for (int s = 1; s <= 10; ++s) {
    rig.engine->advance_clock(at(s));
    REQUIRE(rig.engine->wait_idle());
  }
  tags::TagInfo info;
  REQUIRE(!rig.engine->info("Per", &info));
  CHECK(info.counters.evaluations >= 10);    // it ran every period...
  CHECK(rig.changes.count("Per") == first);  // ...and notified nothing
  // The same value and status again, same timestamp: no change.
  const auto oc = rig.changes.count("OnChange");
  rig.update({src("X", Value(1), Good, at(0))}, at(11));
  CHECK(rig.changes.count("OnChange") == oc);
  // A new value: both notify once.
  rig.update({src("X", Value(2), Good, at(12))}, at(12));
  rig.engine->advance_clock(at(12));
  REQUIRE(rig.engine->wait_idle());
  CHECK(rig.changes.count("OnChange") == oc + 1);
  CHECK(rig.changes.count("Per") == first + 1);
  CHECK(num(rig.read("Per").value) == 4);
}

TEST_CASE("tags: on-read tags evaluate when older than max_age, manual tags on trigger") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  auto onread = tag("OnRead", "state.n = (state.n or 0) + 1 return state.n", {"X"});
  onread.trigger.kind = tags::TriggerKind::on_read;
  onread.trigger.max_age = 5000ms;
  rig.define(onread);
  auto manual = tag("Manual", "return inputs.X + 1", {"X"});
  manual.trigger.kind = tags::TriggerKind::manual;
  rig.define(manual);
  rig.update({src("X", Value(1))}, at(0));
  CHECK(rig.read("Manual").status == tags::codes::BadWaitingForInitialData);  // not yet triggered
  rig.set_clock(at(1));
  // read_now never waits: it says when read() would evaluate first, and reads nothing then.
  auto read_now = [&](const char* id, bool* would_wait) {
    tags::DataValue dv;
    dv.status = 12345;  // a marker: left as it is when nothing is read
    REQUIRE(!rig.engine->read_now(id, &dv, would_wait));
    return dv;
  };
  bool would_wait = false;
  CHECK(read_now("OnRead", &would_wait).status == 12345);
  CHECK(would_wait);
  CHECK(num(rig.read("OnRead").value) == 1);  // never evaluated: evaluates now
  rig.set_clock(at(3));
  CHECK(num(read_now("OnRead", &would_wait).value) == 1);
  CHECK_FALSE(would_wait);
  CHECK(num(rig.read("OnRead").value) == 1);  // 2 s old: served as is
  rig.update({src("X", Value(2))}, at(4));    // an input change does not trigger it
  CHECK(num(rig.read("OnRead").value) == 1);
  rig.set_clock(at(7));
  read_now("OnRead", &would_wait);
  CHECK(would_wait);  // 6 s old
  read_now("Manual", &would_wait);
  CHECK_FALSE(would_wait);  // only on_read tags are evaluated by a read
  tags::DataValue none;
  CHECK(rig.engine->read_now("Nope", &none, &would_wait).code == ErrorCode::invalid_argument);
  CHECK(num(rig.read("OnRead").value) == 2);  // 6 s old: evaluated again
  REQUIRE(!rig.engine->trigger("Manual"));
  REQUIRE(rig.engine->wait_idle());
  CHECK(num(rig.read("Manual").value) == 3);
}

TEST_CASE("tags: a definition that would make a cycle is refused, naming the path") {
  Rig rig(Kind::in_process);
  rig.define(tag("A", "return inputs.S", {"S"}));
  rig.define(tag("B", "return inputs.A", {"A"}));
  rig.define(tag("C", "return inputs.B", {"B"}));
  Error err = rig.engine->define(tag("A", "return inputs.C", {"C"}));
  REQUIRE(err);
  CHECK(err.code == ErrorCode::invalid_argument);
  CHECK(err.message.find("A -> C -> B -> A") != std::string::npos);
  err = rig.engine->define(tag("D", "return 1", {"D"}));
  CHECK(err.message.find("D -> D") != std::string::npos);
  // Nothing changed: A still follows S.
  rig.update({src("S", Value(4))}, at(1));
  CHECK(num(rig.read("C").value) == 4);
  // And a removal while another tag uses it is refused.
  err = rig.engine->remove("B");
  CHECK(err.message.find("input of C") != std::string::npos);
  // Writing a virtual tag is refused.
  CHECK(rig.engine->update({src("B", Value(1))}, at(2)).code == ErrorCode::invalid_argument);
}

TEST_CASE("tags: a diamond is glitch-free: each wave evaluates each tag once, never half a wave") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("L", "return inputs.S + 1", {"S"}));
  rig.define(tag("R", "return inputs.S * 2", {"S"}));
  rig.define(tag("D", "return {l = inputs.L, r = inputs.R}", {"L", "R"}, tags::DataType::Variant));
  rig.define(tag("E", "return inputs.D.l + inputs.D.r + inputs.S", {"D", "S"}));
  rig.update({src("S", Value(0))}, at(0));
  rig.changes.clear();
  tags::TagInfo before;
  REQUIRE(!rig.engine->info("D", &before));
  const int waves = 200;
  for (int i = 1; i <= waves; ++i) {
    rig.set_clock(at(i));
    REQUIRE(!rig.engine->update({src("S", Value(i))}, at(i)));  // no wait: waves may pile up
  }
  REQUIRE(rig.engine->wait_idle());
  // Every D the callback saw is consistent: l == s + 1 and r == 2s for one s.
  for (const auto& c : rig.changes.of("D")) {
    const Value* l = nullptr;
    const Value* r = nullptr;
    for (const auto& e : c.value.value.as<Map>()) (e.key == "l" ? l : r) = &e.value;
    REQUIRE(l);
    REQUIRE(r);
    CHECK(num(*r) == 2 * (num(*l) - 1));
  }
  for (const auto& c : rig.changes.of("E")) {
    // E = (s+1) + 2s + s = 4s + 1 for the same s
    CHECK(std::fmod(num(c.value.value) - 1, 4) == 0);
  }
  tags::TagInfo after;
  REQUIRE(!rig.engine->info("D", &after));
  const auto evals = after.counters.evaluations - before.counters.evaluations;
  CHECK(evals <= static_cast<uint64_t>(waves));  // at most once per wave
  CHECK(evals + after.counters.coalesced - before.counters.coalesced >= 1);
  CHECK(num(rig.read("E").value) == 4 * waves + 1);  // the last wave's result is there
  tags::TagInfo e;
  REQUIRE(!rig.engine->info("E", &e));
  CHECK(e.counters.evaluations <= after.counters.evaluations + 1);
  // In-process waves never pile up: each of them ran every tag exactly once.
  if (kind == Kind::in_process) CHECK(evals == static_cast<uint64_t>(waves));
  // The changes of one wave arrive in one batch, in topological order.
  rig.changes.clear();
  rig.update({src("S", Value(1000))}, at(1000));
  REQUIRE(rig.changes.batch_sizes.size() == 1);
  CHECK(rig.changes.batch_sizes[0] == 4);
  std::vector<std::string> order;
  for (const auto& c : rig.changes.all) order.push_back(c.tag);
  CHECK(order.back() == "E");
  CHECK(order[2] == "D");
}

TEST_CASE(
    "tags: hot reload compiles first, a broken script keeps the old definition, state carries "
    "over") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("Count", "state.n = (state.n or 0) + 1 return state.n", {"X"}));
  for (int i = 1; i <= 3; ++i) rig.update({src("X", Value(i))}, at(i));
  const double before = num(rig.read("Count").value);
  CHECK(before >= 3);
  // A compile error: refused, nothing changes.
  Error err = rig.engine->define(tag("Count", "state.n = ( + 1\nreturn", {"X"}));
  REQUIRE(err);
  CHECK(err.code == ErrorCode::compile_error);
  CHECK(err.message.find("Count") != std::string::npos);
  CHECK(err.message.find(":1:") != std::string::npos);
  rig.update({src("X", Value(10))}, at(10));
  CHECK(num(rig.read("Count").value) == before + 1);
  tags::TagInfo info;
  REQUIRE(!rig.engine->info("Count", &info));
  CHECK(info.version == 1);
  // A good redefinition: `state` carries over to the new script.
  rig.define(tag("Count", "state.n = (state.n or 0) + 100 return state.n", {"X"}));
  REQUIRE(!rig.engine->info("Count", &info));
  CHECK(info.version == 2);
  // The redefinition itself evaluates once (its initial value), from the carried state.
  CHECK(num(rig.read("Count").value) == before + 1 + 100);
  rig.update({src("X", Value(11))}, at(11));
  CHECK(num(rig.read("Count").value) == before + 1 + 200);
  // reset_state: starts empty.
  auto reset = tag("Count", "state.n = (state.n or 0) + 1000 return state.n", {"X"});
  reset.reset_state = true;
  rig.define(reset);
  CHECK(num(rig.read("Count").value) == 1000);
}

TEST_CASE("tags: a killed worker: UncertainLastUsableValue with the last value, then Good again") {
  HostOptions ho;
  ho.retries = 0;  // what was in flight ends worker_lost instead of being retried
  ho.shards = 1;
  ho.timeout = 5000ms;  // the slow script must not time out on a loaded machine
  Rig rig(Kind::host, ho);
  rig.define(tag("Slow",
                 "local t = os.clock() while os.clock() - t < 0.05 do end return inputs.X * 10",
                 {"X"}));
  rig.update({src("X", Value(1))}, at(1));
  CHECK(num(rig.read("Slow").value) == 10);
  rig.changes.clear();
  rig.set_clock(at(2));
  REQUIRE(!rig.engine->update({src("X", Value(2))}, at(2)));
  std::this_thread::sleep_for(15ms);  // the evaluation is running
  REQUIRE(!rig.host->kill_shard(0));
  REQUIRE(rig.changes.wait_for([&] {
    for (const auto& c : rig.changes.of("Slow"))
      if (c.value.status == Good && num(c.value.value) == 20) return true;
    return false;
  }));
  const auto seen = rig.changes.of("Slow");
  REQUIRE(seen.size() >= 2);
  CHECK(seen[0].value.status == tags::codes::UncertainLastUsableValue);
  CHECK(num(seen[0].value.value) == 10);  // the last usable value
  CHECK(seen[0].value.diagnostics.find("worker_lost") != std::string::npos);
  CHECK(seen.back().value.status == Good);
  CHECK(num(seen.back().value.value) == 20);
  // No duplicated change: consecutive notifications always differ.
  for (std::size_t i = 1; i < seen.size(); ++i)
    CHECK_FALSE(seen[i].value.same_as(seen[i - 1].value));
}

TEST_CASE("tags: a worker down past last_usable shows BadResourceUnavailable") {
  HostOptions ho;
  ho.retries = 0;
  ho.shards = 1;
  ho.timeout = 5000ms;
  Rig rig(Kind::host, ho);
  auto d =
      tag("Slow", "local t = os.clock() while os.clock() - t < 0.3 do end return inputs.X", {"X"});
  d.last_usable = 0ms;
  rig.define(d);
  rig.update({src("X", Value(1))}, at(1));
  rig.changes.clear();
  // The kill must find the evaluation running, not still on its way (a loaded machine): the
  // worker, idle until then, has spent CPU on it.
  const int pid = rig.host->worker_pids()[0];
  const auto cpu = [pid] {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    long ticks = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i)
      if (i == 14 || i == 15) ticks += std::stol(field);  // utime, stime
    return ticks;
  };
  const long before = cpu();
  REQUIRE(!rig.engine->update({src("X", Value(2))}, at(2)));
  for (int i = 0; i < 1000 && cpu() - before < 3; ++i) std::this_thread::sleep_for(2ms);
  REQUIRE(!rig.host->kill_shard(0));
  REQUIRE(rig.changes.wait_for([&] { return rig.changes.count("Slow") >= 2; }));
  CHECK(rig.changes.of("Slow")[0].value.status == tags::codes::BadResourceUnavailable);
  CHECK(rig.changes.of("Slow").back().value.status == Good);
}

TEST_CASE("tags: keep_state survives a worker kill, without it, state starts again") {
  HostOptions ho;
  ho.shards = 1;
  Rig rig(Kind::host, ho);
  auto kept = tag("Kept", "state.n = (state.n or 0) + 1 return state.n", {"X"});
  kept.keep_state = true;
  rig.define(kept);
  rig.define(tag("Lost", "state.n = (state.n or 0) + 1 return state.n", {"X"}));
  for (int i = 1; i <= 5; ++i) rig.update({src("X", Value(i))}, at(i));
  const double k0 = num(rig.read("Kept").value);
  const double l0 = num(rig.read("Lost").value);
  CHECK(k0 == 5);  // no initial evaluation before its input had a value; then 5 updates
  CHECK(l0 == 5);
  const int pid = rig.host->worker_pids()[0];
  REQUIRE(!rig.host->kill_shard(0));
  for (int i = 0; i < 500 && (rig.host->worker_pids()[0] == pid || rig.host->worker_pids()[0] == 0);
       ++i)
    std::this_thread::sleep_for(10ms);
  rig.update({src("X", Value(100))}, at(100));
  CHECK(num(rig.read("Kept").value) == k0 + 1);
  CHECK(num(rig.read("Lost").value) == 1);
  tags::TagInfo info;
  REQUIRE(!rig.engine->info("Kept", &info));
  CHECK(info.counters.state_restores >= 1);
}

TEST_CASE("tags: keep_state survives its script's eviction for the worker's script budget") {
  HostOptions ho;
  ho.shards = 1;
  ho.worker_script_budget = 32u << 20;
  // The hoarders build 8 MiB each: under TSan that can pass the default T+G, and this test is
  // about eviction, not kills.
  ho.timeout = 5000ms;
  ho.grace = 5000ms;
  Rig rig(Kind::host, ho);
  auto kept = tag("Kept", "state.n = (state.n or 0) + 1 return state.n", {"X"});
  kept.keep_state = true;
  rig.define(kept);
  rig.define(tag("Lost", "state.n = (state.n or 0) + 1 return state.n", {"X"}));
  for (int i = 1; i <= 5; ++i) rig.update({src("X", Value(i))}, at(i));
  REQUIRE(num(rig.read("Kept").value) == 5);
  REQUIRE(num(rig.read("Lost").value) == 5);
  // Hoarders on the same worker, evaluated after the tags' scripts: theirs are least recently
  // used, so they are closed (and the worker is not restarted: this is not a fresh worker).
  const int pid = rig.host->worker_pids()[0];
  for (int i = 0; i < 6; ++i) {
    Script h = reg(*rig.host, "hoard" + std::to_string(i),
                   "if not hoard then hoard = {} for i = 1, 8 do hoard[i] = "
                   "string.rep('x', 1 << 20) end end return #hoard");
    REQUIRE(rig.host->evaluate(h, {}).get().status == Status::ok);
  }
  REQUIRE(rig.host->shard_stats(0).worker_evictions >= 2);
  rig.update({src("X", Value(100))}, at(100));
  CHECK(num(rig.read("Kept").value) == 6);  // the kept state came back to the new state
  CHECK(num(rig.read("Lost").value) == 1);  // its globals started again
  CHECK(rig.host->worker_pids()[0] == pid);
  CHECK(rig.host->shard_stats(0).deaths == 0);
  tags::TagInfo info;
  REQUIRE(!rig.engine->info("Kept", &info));
  CHECK(info.counters.state_restores >= 1);
}

TEST_CASE("tags: the script sees prev, now, status and source_time") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("Rate",
                 "if state.v == nil then state.t = source_time.L state.v = inputs.L return 0 end "
                 "local r = (inputs.L - state.v) / (source_time.L - state.t) "
                 "state.t = source_time.L state.v = inputs.L return r",
                 {"L"}));
  rig.define(tag("Prev", "return prev and prev.value + 1 or 0", {"L"}));
  rig.define(tag("Now", "return now - 1800000000", {"L"}));
  rig.update({src("L", Value(10.0), Good, at(0))}, at(0));
  rig.update({src("L", Value(20.0), Good, at(5))}, at(5));
  INFO(rig.read("Rate").diagnostics);
  CHECK(num(rig.read("Rate").value) == doctest::Approx(2.0));
  CHECK(num(rig.read("Prev").value) == 1);  // first evaluation at the first input: 0, then 1
  CHECK(num(rig.read("Now").value) == doctest::Approx(5.0));
}

TEST_CASE("tags: virtual tags feed virtual tags, removal and redefinition of inputs") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("C", "return inputs.F * 9 / 5 + 32", {"F"}));  // F: a source for now
  rig.update({src("F", Value(100.0))}, at(1));
  CHECK(num(rig.read("C").value) == doctest::Approx(212));
  // F becomes a virtual tag fed by K.
  rig.define(tag("F", "return inputs.K - 273.15", {"K"}));
  rig.update({src("K", Value(273.15))}, at(2));
  CHECK(num(rig.read("C").value) == doctest::Approx(32));
  CHECK(rig.engine->ids() == std::vector<std::string>{"F", "C"});
  // apply(replace_all) removes what is not listed.
  REQUIRE(!rig.engine->apply({tag("C2", "return inputs.K", {"K"})}, true));
  CHECK(rig.engine->ids() == std::vector<std::string>{"C2"});
  REQUIRE(!rig.engine->remove("C2"));
  CHECK(rig.engine->ids().empty());
}

TEST_CASE("tags: bad definitions are clear errors") {
  Rig rig(Kind::in_process);
  auto expect = [&](tags::TagDefinition d, const char* part) {
    Error err = rig.engine->define(d);
    REQUIRE(err);
    CHECK_MESSAGE(err.message.find(part) != std::string::npos, err.message);
  };
  expect(tag("", "return 1", {}), "tag id");
  expect(tag("A\nB", "return 1", {}), "control character");
  expect(tag("A", "return 1", {"X", "X"}), "twice");
  auto reserved = tag("A", "return 1", {"X"});
  reserved.inputs[0].name = "__c";
  expect(reserved, "reserved");
  auto db = tag("A", "return 1", {"X"});
  db.inputs[0].deadband = tags::DeadbandKind::percent;
  db.inputs[0].deadband_value = 150;
  expect(db, "0..100");
  auto per = tag("A", "return 1", {"X"});
  per.trigger.kind = tags::TriggerKind::periodic;
  per.trigger.period = 0ms;
  expect(per, "period");
  CHECK(rig.engine->define(tag("A", "return (", {})).code == ErrorCode::compile_error);
  CHECK(rig.engine->ids().empty());
}

}  // namespace outrun::test

namespace outrun::test {

TEST_CASE("tags: 10,000 define/remove cycles give back the registry and the workers' scripts") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("Keep", "return inputs.X", {"X"}));
  rig.update({src("X", Value(1))}, at(1));
  auto stats = [&] { return rig.host ? rig.host->registry_stats() : rig.inproc->registry_stats(); };
  auto worker_scripts = [&] {
    uint64_t n = 0;
    if (rig.host)
      for (int i = 0; i < rig.host->shards(); ++i) n += rig.host->shard_stats(i).worker_scripts;
    return n;
  };
  const RegistryStats before = stats();
  const uint64_t workers_before = worker_scripts();
  const int cycles = kSanitized ? 2000 : 10000;
  for (int i = 0; i < cycles; ++i) {
    const std::string id = "T" + std::to_string(i % 7);
    // A new source each time (a new script), evaluated once, then removed.
    Error err = rig.engine->define(tag(id, "return inputs.X + " + std::to_string(i), {"X"}));
    REQUIRE_MESSAGE(!err, err.message);
    if (i % 500 == 0) {
      REQUIRE(rig.engine->wait_idle());
      CHECK(num(rig.read(id).value) == 1 + i);
    }
    err = rig.engine->remove(id);
    REQUIRE_MESSAGE(!err, err.message);
  }
  REQUIRE(rig.engine->wait_idle());
  const RegistryStats after = stats();
  CHECK(after.scripts == before.scripts);
  CHECK(after.bytes == before.bytes);
  if (rig.host) {
    uint64_t w = worker_scripts();
    for (int i = 0; i < 2000 && w != workers_before;
         ++i) {  // the status page follows the Forget frames
      std::this_thread::sleep_for(10ms);
      w = worker_scripts();
    }
    CHECK(w == workers_before);
  }
  CHECK(rig.engine->ids() == std::vector<std::string>{"Keep"});
}

TEST_CASE("tags: redefining a tag 1,000 times keeps one script") {
  Rig rig(Kind::host);
  rig.define(tag("R", "return 0", {"X"}));
  const RegistryStats one = rig.host->registry_stats();
  for (int i = 1; i <= 1000; ++i) {
    Error err = rig.engine->define(tag("R", "return inputs.X + " + std::to_string(i), {"X"}));
    REQUIRE_MESSAGE(!err, err.message);
  }
  rig.update({src("X", Value(1))}, at(1));
  CHECK(num(rig.read("R").value) == 1001);
  const RegistryStats after = rig.host->registry_stats();
  CHECK(after.scripts == one.scripts);
  CHECK(after.bytes < one.bytes + 256);  // the new source is a few bytes longer
}

// ---- Reload, isolation, quality, clocks and change detection (design/tags.md) ----

namespace {

tags::TagDefinition periodic(std::string id, std::string script, std::vector<std::string> inputs,
                             std::chrono::milliseconds period) {
  auto d = tag(std::move(id), std::move(script), std::move(inputs));
  d.trigger.kind = tags::TriggerKind::periodic;
  d.trigger.period = period;
  return d;
}

tags::TagInfo info_of(Rig& rig, const std::string& id) {
  tags::TagInfo info;
  Error err = rig.engine->info(id, &info);
  REQUIRE_MESSAGE(!err, err.message);
  return info;
}

TEST_CASE("tags: a reload leaves unchanged tags alone and never adds a periodic timer") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind, {}, /*manual_periodic=*/false);
  auto avg = tag("Avg", "state.n = (state.n or 0) + 1; return inputs.X + state.n", {"X"});
  auto tick = periodic("Tick", "return 1", {}, 100ms);
  std::vector<tags::TagDefinition> set{avg, tick};
  REQUIRE(!rig.engine->apply(set, true));
  rig.update({src("X", Value(10.0))}, at(1));
  CHECK(num(rig.read("Avg").value) == 11);
  // Three reloads of the same set: nothing runs, nothing moves.
  tags::ApplyResult res;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(!rig.engine->apply(set, tags::ApplyOptions{true, false}, &res));
    CHECK(res.unchanged.size() == 2);
    CHECK(res.defined.empty());
  }
  REQUIRE(rig.engine->wait_idle());
  CHECK(info_of(rig, "Avg").version == 1);
  CHECK(info_of(rig, "Avg").counters.evaluations == 1);
  CHECK(num(rig.read("Avg").value) == 11);
  // A changed definition is evaluated once, and its state carried over.
  set[0].script = "state.n = (state.n or 0) + 1; return inputs.X + state.n + 0";
  REQUIRE(!rig.engine->apply(set, tags::ApplyOptions{true, false}, &res));
  CHECK(res.defined == std::vector<std::string>{"Avg"});
  REQUIRE(rig.engine->wait_idle());
  CHECK(info_of(rig, "Avg").version == 2);
  CHECK(num(rig.read("Avg").value) == 12);
  // The periodic tag redefined three times (a new period each time) runs on one timer: at most
  // one evaluation per period (missed periods are skipped, never queued), so a second holds at
  // most ~10 of them, where four timers would give ~40.
  for (int i = 0; i < 3; ++i) {
    set[1].trigger.period = std::chrono::milliseconds(101 + i);
    REQUIRE(!rig.engine->apply(set, tags::ApplyOptions{true, false}, &res));
    CHECK(res.defined == std::vector<std::string>{"Tick"});
  }
  const auto before = info_of(rig, "Tick").counters.evaluations;
  std::this_thread::sleep_for(1000ms);
  const auto ran = info_of(rig, "Tick").counters.evaluations - before;
  CHECK(ran <= 12);
  CHECK(ran >= 1);
}

TEST_CASE("tags: offline, a periodic tag runs once at its definition and waits for an input") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);  // manual clock
  rig.define(periodic("P", "return inputs.X * 2", {"X"}, 1000ms));
  rig.engine->advance_clock(at(0));
  rig.engine->advance_clock(at(3));
  REQUIRE(rig.engine->wait_idle());
  CHECK(info_of(rig, "P").counters.evaluations == 0);  // no input yet
  CHECK(rig.read("P").status == tags::codes::BadWaitingForInitialData);
  CHECK(rig.changes.count("P") == 0);
  rig.update({src("X", Value(4.0))}, at(3.5));  // its first input: it runs, then on its period
  CHECK(info_of(rig, "P").counters.evaluations == 1);
  CHECK(num(rig.read("P").value) == 8);
  rig.engine->advance_clock(at(4));
  REQUIRE(rig.engine->wait_idle());
  rig.define(periodic("Q", "return inputs.X * 3", {"X"}, 1000ms));  // its input has a value
  rig.engine->advance_clock(at(4));
  REQUIRE(rig.engine->wait_idle());
  CHECK(info_of(rig, "Q").counters.evaluations == 1);  // once for the definition, not twice
  rig.engine->advance_clock(at(5));
  REQUIRE(rig.engine->wait_idle());
  CHECK(info_of(rig, "Q").counters.evaluations == 2);
}

TEST_CASE("tags: a Bad input is not evaluated, a Bad output carries no value") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("Twice", "return inputs.X * 2", {"X", "Y"}));
  rig.define(tag("Forced", "return 10, 'BadSensorFailure'", {"X"}));
  auto sees =
      tag("Sees", "if inputs.X == nil then return -1, StatusCode.Good end return inputs.X", {"X"});
  sees.evaluate_bad_inputs = true;
  rig.define(sees);
  rig.define(tag("Down", "return inputs.Twice + 1", {"Twice"}));
  // Y never written: not evaluated, BadWaitingForInitialData and nothing notified.
  rig.update({src("X", Value(5.0))}, at(1));
  CHECK(rig.read("Twice").status == tags::codes::BadWaitingForInitialData);
  CHECK(info_of(rig, "Twice").counters.evaluations == 0);
  rig.update({src("Y", Value(0.0))}, at(2));
  CHECK(num(rig.read("Twice").value) == 10);
  CHECK(num(rig.read("Down").value) == 11);
  // A failed sensor with a null value: no BadInternalError from `nil * 2`, its own code.
  const auto evals = info_of(rig, "Twice").counters.evaluations;
  rig.update({src("X", Value(), kBadSensor)}, at(3));
  const auto tw = rig.read("Twice");
  CHECK(tw.status == kBadSensor);
  CHECK(tw.value.is_nil());
  CHECK(tw.diagnostics == "not evaluated: input 'X' is BadSensorFailure");
  CHECK(info_of(rig, "Twice").counters.evaluations == evals);
  CHECK(info_of(rig, "Twice").counters.skipped_bad >= 1);
  CHECK(rig.read("Down").status == kBadSensor);  // downstream, by the same rule
  CHECK(num(rig.read("Sees").value) == -1);      // it asked to see Bad inputs
  CHECK(rig.read("Sees").status == tags::codes::Good);
  // A script's value with a Bad status is not published.
  const auto forced = rig.read("Forced");
  CHECK(forced.status == kBadSensor);
  CHECK(forced.value.is_nil());
  // Uncertain inputs are evaluated, their code kept; Good again: evaluated, Good.
  rig.update({src("X", Value(6.0), kUncSub)}, at(4));
  CHECK(num(rig.read("Twice").value) == 12);
  CHECK(rig.read("Twice").status == kUncSub);
  rig.update({src("X", Value(7.0))}, at(5));
  CHECK(num(rig.read("Twice").value) == 14);
  CHECK(rig.read("Twice").status == Good);
  CHECK(num(rig.read("Down").value) == 15);
}

TEST_CASE("tags: NaN notifies once, deadbands per array element, timestamp-only changes") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("Nan", "return inputs.X * 0 / 0", {"X"}));
  // (The same source timestamp each time: a new one would be a change of its own.)
  for (int i = 1; i <= 5; ++i) rig.update({src("X", Value(double(i)), Good, at(1))}, at(i));
  CHECK(info_of(rig, "Nan").counters.evaluations == 5);
  CHECK(rig.changes.count("Nan") == 1);  // entered NaN once
  // Deadband: entering and leaving NaN pass it, NaN to NaN does not.
  auto db = tag("Db", "return 1", {"D"});
  db.inputs[0].deadband = tags::DeadbandKind::absolute;
  db.inputs[0].deadband_value = 5;
  rig.define(db);
  auto evals = [&](const std::string& id) { return info_of(rig, id).counters.evaluations; };
  rig.update({src("D", Value(1.0), Good, at(10))}, at(10));
  const auto e0 = evals("Db");
  rig.update({src("D", Value(2.0), Good, at(10))}, at(11));
  CHECK(evals("Db") == e0);  // within the deadband
  rig.update({src("D", Value(std::nan("")), Good, at(10))}, at(12));
  CHECK(evals("Db") == e0 + 1);
  rig.update({src("D", Value(std::nan("")), Good, at(10))}, at(13));
  CHECK(evals("Db") == e0 + 1);
  rig.update({src("D", Value(2.0), Good, at(10))}, at(14));
  CHECK(evals("Db") == e0 + 2);
  // Arrays: element by element, a new length always counts.
  auto arr = tag("Arr", "return #inputs.A", {"A"});
  arr.inputs[0].deadband = tags::DeadbandKind::absolute;
  arr.inputs[0].deadband_value = 1;
  rig.define(arr);
  rig.update({src("A", Value(Array{Value(1.0), Value(2.0)}))}, at(20));
  const auto a0 = evals("Arr");
  rig.update({src("A", Value(Array{Value(1.5), Value(2.5)}))}, at(21));
  CHECK(evals("Arr") == a0);
  rig.update({src("A", Value(Array{Value(1.5), Value(9.0)}))}, at(22));
  CHECK(evals("Arr") == a0 + 1);
  rig.update({src("A", Value(Array{Value(1.5), Value(9.0), Value(0.0)}))}, at(23));
  CHECK(evals("Arr") == a0 + 2);
  // The same value with a new source timestamp: a tag whose policy reads it runs (and its output
  // takes the new timestamp); one stamped with the evaluation time does not.
  rig.define(tag("Newest", "return inputs.T", {"T"}));
  auto by_eval = tag("ByEval", "return inputs.T", {"T"});
  by_eval.timestamps = tags::TimestampPolicy::evaluation_time;
  rig.define(by_eval);
  rig.update({src("T", Value(1.0), Good, at(30))}, at(30));
  const auto n0 = evals("Newest"), b0 = evals("ByEval");
  rig.update({src("T", Value(1.0), Good, at(31))}, at(31));
  CHECK(evals("Newest") == n0 + 1);
  CHECK(rig.read("Newest").source_time == at(31));
  CHECK(evals("ByEval") == b0);
}

TEST_CASE("tags: merged updates set the Overflow bit, every_update sees each update in order") {
  HostOptions ho;
  ho.shards = 2;
  // The scripts spin on CPU time: on a loaded machine 20 ms of it can take longer than the
  // default T (100 ms) of wall time. This test is about merging, not timeouts.
  ho.timeout = std::chrono::seconds(5);
  auto host = start_host(ho);
  Changes changes;
  tags::TagsOptions to;
  to.on_change = [&](const std::vector<tags::Change>& b) { changes.add(b); };
  to.max_update_queue = 1000;
  std::unique_ptr<tags::Engine> engine;
  REQUIRE(!tags::Engine::create(*host, to, &engine));
  // A slow script (~20 ms), so that updates arrive while it runs.
  const std::string slow = "local t = os.clock() + 0.02 while os.clock() < t do end ";
  auto latest = tag("Latest", slow + "return inputs.X", {"X"});
  auto every = tag("Every", slow + "return inputs.Y", {"Y"});
  every.every_update = true;
  REQUIRE(!engine->apply({latest, every}, false));
  constexpr int kN = 20;
  for (int i = 1; i <= kN; ++i) {
    REQUIRE(!engine->update({src("X", Value(double(i))), src("Y", Value(double(i)))}));
  }
  REQUIRE(engine->wait_idle(60s));
  tags::TagInfo li, ei;
  REQUIRE(!engine->info("Latest", &li));
  REQUIRE(!engine->info("Every", &ei));
  CHECK(li.counters.coalesced > 0);
  CHECK(li.counters.overflows >= 1);
  bool flagged = false;
  for (const auto& c : changes.of("Latest"))
    if ((c.value.status & tags::kOverflowBits) == tags::kOverflowBits) flagged = true;
  CHECK(flagged);
  CHECK(num(li.value.value) == kN);  // the latest one wins
  // Every update of Y, in order, none flagged.
  const auto ev = changes.of("Every");
  REQUIRE(ev.size() == kN);
  for (int i = 0; i < kN; ++i) {
    CHECK(num(ev[i].value.value) == i + 1);
    CHECK(ev[i].value.status == Good);
  }
  CHECK(ei.counters.coalesced == 0);
  CHECK(ei.counters.overflows == 0);
}

TEST_CASE("tags: every_update's queue is bounded: the oldest is dropped, counted and flagged") {
  HostOptions ho;
  ho.shards = 1;
  ho.timeout = std::chrono::seconds(5);  // CPU-time spins, not about timeouts (above)
  auto host = start_host(ho);
  Changes changes;
  tags::TagsOptions to;
  to.on_change = [&](const std::vector<tags::Change>& b) { changes.add(b); };
  to.max_update_queue = 3;
  std::unique_ptr<tags::Engine> engine;
  REQUIRE(!tags::Engine::create(*host, to, &engine));
  auto every = tag(
      "Every", "local t = os.clock() + 0.05 while os.clock() < t do end return inputs.Y", {"Y"});
  every.every_update = true;
  REQUIRE(!engine->define(every));
  for (int i = 1; i <= 10; ++i) REQUIRE(!engine->update({src("Y", Value(double(i)))}));
  REQUIRE(engine->wait_idle(60s));
  tags::TagInfo ei;
  REQUIRE(!engine->info("Every", &ei));
  CHECK(ei.counters.coalesced >= 1);  // dropped past the bound
  CHECK(ei.counters.overflows >= 1);
  CHECK(num(ei.value.value) == 10);
  CHECK(changes.count("Every") <= 5);  // the running one, the pending one, at most 3 queued
}

TEST_CASE("tags: broken definitions are isolated (cycles, config errors, compile errors)") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  auto a = tag("A", "return inputs.B", {"B"});
  auto b = tag("B", "return inputs.A", {"A"});
  auto c = tag("C", "return inputs.X + 1", {"X"});
  auto d = tag("D", "return inputs.A", {"A"});
  auto e = tag("E", "return (", {"X"});
  e.location = "t.toml:20:1";
  e.script_origin = "t.toml";
  e.script_line = 22;
  auto f = tag("F", "return 1", {"X"});
  f.config_error = "type: unknown DataType 'Dobule'";
  f.location = "t.toml:31:8";
  auto g = tag(std::string(300, 'g'), "return 1", {});
  g.location = "t.toml:40:1";
  const std::vector<tags::TagDefinition> set{a, b, c, d, e, f, g};
  // Strict: refused as a whole, every error listed, nothing defined.
  tags::ApplyResult res;
  Error err = rig.engine->apply(set, tags::ApplyOptions{false, true}, &res);
  CHECK(err);
  CHECK(res.errors.size() == 5);  // A, B (cycle), E (compile), F (config), the long id
  CHECK(rig.engine->ids().empty());
  // Not strict: the others run.
  err = rig.engine->apply(set, tags::ApplyOptions{false, false}, &res);
  REQUIRE_MESSAGE(!err, err.message);
  REQUIRE(rig.engine->wait_idle());
  REQUIRE(res.errors.size() == 5);
  std::map<std::string, tags::DefinitionError> by_id;
  for (const auto& x : res.errors) by_id[x.id] = x;
  CHECK(by_id["A"].message.find("cycle: ") != std::string::npos);
  CHECK(by_id["A"].installed);
  CHECK(by_id["B"].installed);
  CHECK(by_id["E"].code == ErrorCode::compile_error);
  CHECK(by_id["E"].location == "t.toml:22:1");
  CHECK(by_id["F"].location == "t.toml:31:8");
  CHECK(by_id[""].location == "t.toml:40:1");  // no usable id: reported, not installed
  CHECK_FALSE(by_id[""].installed);
  for (const char* id : {"A", "B", "E", "F"}) {
    CAPTURE(id);
    const auto v = rig.read(id);
    CHECK(v.status == tags::codes::BadConfigurationError);
    CHECK(v.value.is_nil());
    CHECK_FALSE(v.diagnostics.empty());
  }
  CHECK(rig.read("E").diagnostics.rfind("t.toml:22:1: tag 'E': compile_error: ", 0) == 0);
  rig.update({src("X", Value(1.0))}, at(1));
  CHECK(num(rig.read("C").value) == 2);
  CHECK(rig.read("D").status == tags::codes::BadConfigurationError);  // the quality rule
  // Fixed: they run, and D follows.
  std::vector<tags::TagDefinition> fixed{
      tag("A", "return 7", {}), b, c, d, tag("E", "return 5", {"X"}), tag("F", "return 1", {"X"})};
  err = rig.engine->apply(fixed, tags::ApplyOptions{true, false}, &res);
  REQUIRE_MESSAGE(!err, err.message);
  REQUIRE(rig.engine->wait_idle());
  CHECK(res.errors.empty());
  CHECK(num(rig.read("A").value) == 7);
  CHECK(num(rig.read("B").value) == 7);
  CHECK(num(rig.read("D").value) == 7);
  CHECK(num(rig.read("E").value) == 5);
}

TEST_CASE("tags: the wave's time never goes back") {
  FOR_EACH_RUNNER(kind);
  Rig rig(kind);
  rig.define(tag("S", "return now", {"X"}, tags::DataType::Double));
  rig.set_clock(at(10));
  REQUIRE(!rig.engine->update({src("X", Value(1.0), Good, at(99))}));
  REQUIRE(rig.engine->wait_idle());
  CHECK(rig.read("S").server_time == at(10));
  CHECK(rig.read("S").source_time == at(99));  // the writer's own timestamp
  rig.set_clock(at(5));                        // the system clock steps back
  REQUIRE(!rig.engine->update({src("X", Value(2.0), Good, at(100))}));
  REQUIRE(rig.engine->wait_idle());
  CHECK(rig.read("S").server_time == at(10));
  CHECK(num(rig.read("S").value) == doctest::Approx(at(10).unix_seconds()));
}

// Runs `f` on a thread with a 512 KiB stack: a recursion whose depth the input controls
// overflows it long before 8 MiB would (a 100,000-deep chain did, on any stack).
void on_small_stack(std::function<void()> f) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 512u << 10);
  pthread_t th;
  auto* fn = new std::function<void()>(std::move(f));
  REQUIRE(pthread_create(
              &th, &attr,
              [](void* p) -> void* {
                auto* g = static_cast<std::function<void()>*>(p);
                (*g)();
                delete g;
                return nullptr;
              },
              fn) == 0);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
}

TEST_CASE("tags: a wave through a 20,000-deep chain uses no stack per tag") {
  Rig rig(Kind::in_process);
  std::vector<tags::TagDefinition> defs;
  constexpr int kDepth = 20'000;
  for (int i = 0; i < kDepth; ++i) {
    auto d = tag("c" + std::to_string(i), "return inputs.x",
                 {i + 1 < kDepth ? "c" + std::to_string(i + 1) : std::string("src")});
    d.inputs[0].name = "x";
    defs.push_back(std::move(d));
  }
  Error err;
  on_small_stack([&] { err = rig.engine->apply(defs, false); });
  REQUIRE_MESSAGE(!err, err.message);
  REQUIRE(rig.engine->wait_idle());
  // A Bad source: no tag is evaluated, each takes its input's code, one after the other.
  on_small_stack([&] {
    err = rig.engine->update({src("src", Value(1.0), tags::codes::BadSensorFailure)}, at(1));
  });
  REQUIRE_MESSAGE(!err, err.message);
  REQUIRE(rig.engine->wait_idle());
  CHECK(rig.read("c0").status == tags::codes::BadSensorFailure);
  // A Good one: each tag is evaluated in turn (the runner answers inline: InProcess).
  on_small_stack([&] { err = rig.engine->update({src("src", Value(2.0))}, at(2)); });
  REQUIRE_MESSAGE(!err, err.message);
  REQUIRE(rig.engine->wait_idle());
  CHECK(num(rig.read("c0").value) == 2.0);
}

TEST_CASE("tags: max_tags bounds the virtual tags") {
  InProcess runner(InProcessOptions{});
  tags::TagsOptions to;
  to.max_tags = 3;
  std::unique_ptr<tags::Engine> engine;
  REQUIRE(!tags::Engine::create(runner, to, &engine));
  REQUIRE(!engine->apply({tag("a", "return 1", {}), tag("b", "return 1", {})}, false));
  Error e = engine->apply({tag("c", "return 1", {}), tag("d", "return 1", {})}, false);
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("max_tags (3)") != std::string::npos, e.message);
  CHECK(engine->ids().size() == 2);
}

TEST_CASE("tags: source tags are bounded in bytes, per writer, and freed with their owner") {
  InProcess runner(InProcessOptions{});
  tags::TagsOptions to;
  to.max_source_bytes = 10'000;
  to.max_source_value_bytes = 4'000;
  std::unique_ptr<tags::Engine> engine;
  REQUIRE(!tags::Engine::create(runner, to, &engine));
  REQUIRE(!engine->apply({tag("t", "return #inputs.s", {"s"})}, false));
  auto str = [](std::size_t n) { return Value(std::string(n, 'v')); };
  Error e = engine->update({src("x", str(5'000))});
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("max_source_value_bytes (4000)") != std::string::npos, e.message);
  tags::UpdateOptions o;
  o.owner = 7;
  o.uid = 1000;
  o.max_uid_bytes = 6'000;
  REQUIRE(!engine->update({src("x1", str(3'000))}, o));
  e = engine->update({src("x2", str(3'500))}, o);  // the uid's bytes
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("max_uid_bytes (6000)") != std::string::npos, e.message);
  REQUIRE(!engine->update({src("x1", str(3'500))}, o));  // a new value replaces the old one
  CHECK(engine->source_usage(1000).bytes < 4'000);
  tags::UpdateOptions p = o;
  p.owner = 8;
  p.uid = 1001;
  p.max_uid_bytes = SIZE_MAX;
  REQUIRE(!engine->update({src("y1", str(3'500))}, p));
  e = engine->update({src("y2", str(3'500))}, p);  // the total
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("max_source_bytes (10000)") != std::string::npos, e.message);
  // The owner's sources no tag reads go; the one a tag reads stays (the definitions' now).
  REQUIRE(!engine->update({src("s", str(10))}, o));
  CHECK(engine->forget_sources(7) == 1);  // x1
  CHECK(engine->contains("s"));
  CHECK_FALSE(engine->contains("x1"));
  CHECK(engine->source_usage(1000).sources == 0);
  REQUIRE(!engine->update({src("y2", str(3'500))}, p));  // room again
  // Not allowed to create: only ids that exist.
  tags::UpdateOptions q;
  q.may_create = false;
  CHECK(engine->update({src("new", Value(1.0))}, q).code == ErrorCode::invalid_argument);
  REQUIRE(!engine->update({src("s", Value(std::string("abc")))}, q));
  // A source a definition made goes when no tag reads it any more.
  REQUIRE(!engine->apply({tag("t", "return 1", {})}, tags::ApplyOptions{true, false}, nullptr));
  CHECK_FALSE(engine->contains("s"));
}

}  // namespace

}  // namespace outrun::test

namespace outrun::test {
namespace {
// What a state store would be told (tags::StateSink), for the restart tests.
struct RecordingSink : tags::StateSink {
  std::mutex mu;
  std::map<std::string, tags::RestoredTag> rows;
  std::vector<std::string> removals;
  void saved(const std::string& id, const tags::DataValue& value, const Value* state,
             const std::string& sha) override {
    std::lock_guard lock(mu);
    tags::RestoredTag& r = rows[id];
    r.id = id;
    r.value = value;
    r.has_value = true;
    r.has_state = state != nullptr;
    r.state = state != nullptr ? *state : Value();
    r.script_sha256 = sha;
  }
  void removed(const std::string& id) override {
    std::lock_guard lock(mu);
    rows.erase(id);
    removals.push_back(id);
  }
  std::string note(const std::string&) override { return {}; }
};
}  // namespace
}  // namespace outrun::test

using outrun::test::RecordingSink;

TEST_CASE("tags: a state sink is told values and states, restored rows come back Uncertain") {
  using namespace outrun;
  using namespace outrun::test;
  auto sink = std::make_shared<RecordingSink>();
  const auto total = [] {
    auto d = tag("T", "state.n = (state.n or 0) + inputs.X return state.n", {"X"});
    d.keep_state = true;
    return d;
  }();
  {
    Rig rig(Kind::in_process, {}, true, [&](tags::TagsOptions& o) { o.state_sink = sink; });
    rig.define(total);
    rig.define(tag("Plain", "return inputs.X * 2", {"X"}));
    for (int i = 1; i <= 3; ++i) rig.update({src("X", Value(i), Good, at(i))}, at(i));
    CHECK(num(rig.read("T").value) == 6);
    std::lock_guard lock(sink->mu);
    REQUIRE(sink->rows.count("T"));
    CHECK(sink->rows["T"].has_state);
    CHECK(num(sink->rows["T"].value.value) == 6);
    CHECK(!sink->rows["T"].script_sha256.empty());
    REQUIRE(sink->rows.count("Plain"));
    CHECK_FALSE(sink->rows["Plain"].has_state);
  }
  std::vector<tags::RestoredTag> rows;
  {
    std::lock_guard lock(sink->mu);
    for (auto& r : sink->rows) rows.push_back(r.second);
  }
  SUBCASE("restored: Uncertain until evaluated, then counting on") {
    Rig rig(Kind::in_process, {}, true, [&](tags::TagsOptions& o) { o.restored = rows; });
    rig.define(total);
    const tags::DataValue dv = rig.read("T");
    CHECK(dv.status == tags::codes::UncertainLastUsableValue);
    CHECK(num(dv.value) == 6);
    CHECK(dv.source_time == at(3));
    rig.update({src("X", Value(4), Good, at(4))}, at(4));
    CHECK(rig.read("T").status == Good);
    CHECK(num(rig.read("T").value) == 10);
  }
  SUBCASE("a changed script keeps its state, unless reset_state") {
    auto changed = total;
    changed.script = "state.n = (state.n or 0) + inputs.X return state.n + 0";
    SUBCASE("kept") {
      Rig rig(Kind::in_process, {}, true, [&](tags::TagsOptions& o) { o.restored = rows; });
      rig.define(changed);
      rig.update({src("X", Value(4), Good, at(4))}, at(4));
      CHECK(num(rig.read("T").value) == 10);
    }
    SUBCASE("reset_state") {
      changed.reset_state = true;
      Rig rig(Kind::in_process, {}, true, [&](tags::TagsOptions& o) { o.restored = rows; });
      rig.define(changed);
      rig.update({src("X", Value(4), Good, at(4))}, at(4));
      CHECK(num(rig.read("T").value) == 4);
    }
  }
  SUBCASE("a damaged row: from {}, and the diagnostics say so") {
    for (auto& r : rows) r.problem = "the stored row is damaged (checksum mismatch)";
    Rig rig(Kind::in_process, {}, true, [&](tags::TagsOptions& o) { o.restored = rows; });
    rig.define(total);
    CHECK(rig.read("T").status == tags::codes::BadWaitingForInitialData);
    CHECK(rig.read("T").diagnostics.find("checksum mismatch") != std::string::npos);
    tags::TagInfo info;
    REQUIRE(!rig.engine->info("T", &info));
    CHECK(info.counters.state_store.find("starts from {}") != std::string::npos);
    rig.update({src("X", Value(4), Good, at(4))}, at(4));
    CHECK(num(rig.read("T").value) == 4);
  }
  SUBCASE("removing a tag tells the sink") {
    auto sink2 = std::make_shared<RecordingSink>();
    Rig rig(Kind::in_process, {}, true, [&](tags::TagsOptions& o) { o.state_sink = sink2; });
    rig.define(total);
    rig.update({src("X", Value(1), Good, at(1))}, at(1));
    REQUIRE(!rig.engine->remove("T"));
    std::lock_guard lock(sink2->mu);
    CHECK(sink2->removals == std::vector<std::string>{"T"});
    CHECK(sink2->rows.count("T") == 0);
  }
}
