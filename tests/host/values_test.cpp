// Host-side value codec: outrun::Value <-> wire::Value, display, statuses.
#include <doctest/doctest.h>
#include <flatbuffers/flatbuffers.h>

#include <cmath>
#include <limits>

#include "json_values.h"
#include "outrun/status.h"
#include "wire_codec.h"

using namespace outrun;

namespace {

Value round_trip(const Value& v) {
  flatbuffers::FlatBufferBuilder f;
  auto off = detail::encode_value(f, v);
  f.Finish(off);
  const auto* wv = flatbuffers::GetRoot<wire::Value>(f.GetBufferPointer());
  Value out;
  REQUIRE(detail::decode_value(wv, &out));
  return out;
}

Value nest(int levels) {
  Value v = Value(1);
  for (int i = 0; i < levels; ++i) v = Value(Array{v});
  return v;
}

}  // namespace

TEST_CASE("Values: every type round-trips through the wire encoding") {
  const Value cases[] = {
      Value(),
      Value(true),
      Value(false),
      Value(int64_t{0}),
      Value(std::numeric_limits<int64_t>::min()),
      Value(std::numeric_limits<int64_t>::max()),
      Value(0.5),
      Value(-0.0),
      Value(1e308),
      Value(std::string("")),
      Value(std::string("h\xc3\xa9llo\0world", 12)),
      Value(Bytes{std::string("\x00\xff\x80", 3)}),
      Value(Array{}),
      Value(Array{Value(1), Value("two"), Value(3.0), Value(), Value(Array{Value(true)})}),
      Value(Map{}),
      Value(Map{{"a", Value(1)}, {"b", Value(Map{{"c", Value(Bytes{"z"})}})}}),
      nest(kMaxValueDepth),
  };
  for (const Value& v : cases) {
    INFO(to_display_string(v));
    CHECK(round_trip(v) == v);
  }
  Value nan = round_trip(Value(std::nan("")));
  CHECK(std::isnan(nan.as<double>()));
}

TEST_CASE("Values: a worker value nested too deep or with mismatched map is rejected") {
  flatbuffers::FlatBufferBuilder f;
  f.Finish(detail::encode_value(f, nest(kMaxValueDepth + 1)));
  Value out;
  CHECK_FALSE(detail::decode_value(flatbuffers::GetRoot<wire::Value>(f.GetBufferPointer()), &out));

  flatbuffers::FlatBufferBuilder g;
  std::vector<flatbuffers::Offset<flatbuffers::String>> keys{g.CreateString("a"),
                                                             g.CreateString("b")};
  std::vector<flatbuffers::Offset<wire::Value>> items{wire::CreateValue(g)};
  auto kv = g.CreateVector(keys);
  auto iv = g.CreateVector(items);
  wire::ValueBuilder vb(g);
  vb.add_kind(wire::ValueKind::Map);
  vb.add_keys(kv);
  vb.add_items(iv);
  g.Finish(vb.Finish());
  CHECK_FALSE(detail::decode_value(flatbuffers::GetRoot<wire::Value>(g.GetBufferPointer()), &out));

  flatbuffers::FlatBufferBuilder h;
  wire::ValueBuilder ub(h);
  ub.add_kind(static_cast<wire::ValueKind>(200));  // a kind from nobody's schema
  h.Finish(ub.Finish());
  CHECK_FALSE(detail::decode_value(flatbuffers::GetRoot<wire::Value>(h.GetBufferPointer()), &out));
}

TEST_CASE("Values: inputs past the limits are refused before anything is sent") {
  flatbuffers::FlatBufferBuilder f;
  detail::InputsOffset off;
  std::string err;
  // kMaxValueDepth nested containers may hold a scalar; one container more is refused.
  CHECK(detail::encode_inputs(f, {{"a", Value(1)}, {"b", nest(kMaxValueDepth)}}, &off, &err));
  CHECK_FALSE(detail::encode_inputs(f, {{"a", nest(kMaxValueDepth + 1)}}, &off, &err));
  CHECK(err.find("'a'") != std::string::npos);
  CHECK_FALSE(detail::encode_inputs(
      f, {{"big", Value(std::string(detail::kMaxInputBytes + 1, 'x'))}}, &off, &err));
}

TEST_CASE("Values: display strings read like Lua") {
  CHECK(to_display_string(Value(1.5)) == "1.5");
  CHECK(to_display_string(Value(3.0)) == "3.0");
  CHECK(to_display_string(Value(int64_t{3})) == "3");
  CHECK(to_display_string(Value("plain")) == "plain");
  CHECK(to_display_string(Value()) == "nil");
  CHECK(to_display_string(Value(Array{Value("a"), Value(1)})) == "[\"a\", 1]");
  CHECK(to_display_string(Value(Map{{"k", Value(true)}})) == "{\"k\": true}");
  CHECK(to_display_string(Value(Bytes{"\x01\xab"})) == "0x01ab");
}

TEST_CASE("Statuses: names round-trip") {
  for (int i = 0; i <= static_cast<int>(Status::invalid_argument); ++i) {
    Status s;
    REQUIRE(parse_status(to_string(static_cast<Status>(i)), &s));
    CHECK(static_cast<int>(s) == i);
  }
  Status s;
  CHECK_FALSE(parse_status("nope", &s));
  CHECK(to_string(Status::worker_lost) == "worker_lost");
}

TEST_CASE("CLI values: -i scalars and JSON inputs") {
  using json_values::parse_scalar;
  CHECK(parse_scalar("1") == Value(int64_t{1}));
  CHECK(parse_scalar("-7") == Value(int64_t{-7}));
  CHECK(parse_scalar("2.5") == Value(2.5));
  CHECK(parse_scalar("true") == Value(true));
  CHECK(parse_scalar("nil") == Value());
  CHECK(parse_scalar("\"12\"") == Value("12"));
  CHECK(parse_scalar("Line1") == Value("Line1"));
  CHECK(parse_scalar("") == Value(""));
  std::string range_err;
  CHECK(parse_scalar("1e300", &range_err) == Value(1e300));
  CHECK(range_err.empty());
  parse_scalar("1e400", &range_err);  // not the string "1e400"
  CHECK(range_err.find("out of a double's range") != std::string::npos);
  Value v;
  std::string err;
  REQUIRE(json_values::from_json(nlohmann::json::parse(R"({"a":[1,2.5,null,"x"],"b":{"c":true}})"),
                                 &v, &err));
  CHECK(json_values::to_json(v) ==
        nlohmann::json::parse(R"({"a":[1,2.5,null,"x"],"b":{"c":true}})"));
  nlohmann::json deep = 1;
  for (int i = 0; i < kMaxValueDepth + 1; ++i) deep = nlohmann::json::array({deep});
  CHECK_FALSE(json_values::from_json(deep, &v, &err));
}
