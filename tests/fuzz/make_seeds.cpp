// fuzz_make_seeds DIR: writes the binary seed corpora of the fuzz targets into DIR/<target>/
// (tests/fuzz/corpus/ in the repository), built with the same FlatBuffers builders the host and
// the worker use, so every fuzzer starts from real Hello/Evaluate/Results/Shutdown frames.
// The Lua seeds of fuzz_compile are plain files, kept by hand.
//
//   build-fuzz/fuzz/fuzz_make_seeds tests/fuzz/corpus
//
// Targets that take fuzzer choices from the back of the input (FuzzedDataProvider) get them
// appended in the byte order FuzzedDataProvider reads them (see Tail).
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/wire_value.h"
#include "outrun/value.h"
#include "wire_codec.h"

using namespace outrun;
using ByteVec = std::vector<uint8_t>;
using Ref = flatbuffers::Offset<wire::Value>;

namespace {

std::string g_dir;

void write_seed(const std::string& target, const std::string& name, const ByteVec& b) {
  const std::string dir = g_dir + "/" + target;
  mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(b.data(), 1, b.size(), f) != b.size() || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
}

ByteVec finish(flatbuffers::FlatBufferBuilder& fbb, wire::Body type,
               flatbuffers::Offset<void> body) {
  const auto frame = protocol::finish_frame(fbb, type, body);
  return ByteVec(frame.begin(), frame.end());
}

ByteVec cat(std::initializer_list<ByteVec> parts) {
  ByteVec out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

ByteVec hello(uint16_t version = protocol::kProtocolVersion) {
  flatbuffers::FlatBufferBuilder fbb(64);
  return finish(fbb, wire::Body::Hello, wire::CreateHello(fbb, version, 4242).Union());
}

ByteVec shutdown() {
  flatbuffers::FlatBufferBuilder fbb(64);
  return finish(fbb, wire::Body::Shutdown, wire::CreateShutdown(fbb).Union());
}

// A value of every kind, nested.
Value sample_value() {
  return Value(Map{{"alarm", Value(true)},
                   {"level", Value(int64_t{-7})},
                   {"mean", Value(2.5)},
                   {"name", Value("Line1.Avg")},
                   {"raw", Value(outrun::Bytes{std::string("\xff\x00\x01", 3)})},
                   {"nil", Value()},
                   {"list", Value(Array{Value(1), Value(Array{Value("x")}), Value(Map{})})},
                   {"nan", Value(std::numeric_limits<double>::quiet_NaN())}});
}

Value nested(int depth) {
  Value v(int64_t{1});
  for (int i = 0; i < depth; ++i) v = Value(Array{v});
  return v;
}

struct Res {
  uint64_t id;
  wire::Status status;
  const Value* value;
  const char* error;
};

ByteVec results(const std::vector<Res>& rs) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  std::vector<flatbuffers::Offset<wire::Result>> items;
  for (const auto& r : rs) {
    Ref v = r.value ? detail::encode_value(fbb, *r.value) : Ref();
    auto e = r.error ? fbb.CreateString(r.error) : flatbuffers::Offset<flatbuffers::String>();
    items.push_back(wire::CreateResult(fbb, r.id, r.status, v, e));
  }
  return finish(fbb, wire::Body::Results,
                wire::CreateResults(fbb, fbb.CreateVector(items)).Union());
}

struct Eval {
  uint64_t id;
  uint32_t script_id;
  const char* source;  // null: by id only
  uint64_t timeout_us;
  Inputs inputs;
  bool encoded = false;  // inputs as protocol 2's inputs_buffer
};

ByteVec evaluate(const std::vector<Eval>& es) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  std::vector<flatbuffers::Offset<wire::Evaluation>> items;
  flatbuffers::FlatBufferBuilder list(256);
  for (const auto& e : es) {
    detail::InputsOffset inputs;
    detail::InputBufferOffset buffer;
    std::string err;
    if (e.encoded) {
      std::span<const uint8_t> bytes;
      if (!detail::encode_input_list(list, e.inputs, &bytes, &err)) std::abort();
      buffer = protocol::add_input_list(fbb, bytes);
    } else if (!detail::encode_inputs(fbb, e.inputs, &inputs, &err)) {
      std::abort();
    }
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> sha;
    flatbuffers::Offset<flatbuffers::String> src, name;
    if (e.source) {
      uint8_t h[32];
      for (int i = 0; i < 32; ++i) h[i] = static_cast<uint8_t>(std::strlen(e.source) * 31 + i);
      sha = fbb.CreateVector(h, 32);
      src = fbb.CreateString(e.source);
      name = fbb.CreateString("Line1.Script" + std::to_string(e.script_id));
    }
    items.push_back(wire::CreateEvaluation(fbb, e.id, e.script_id, sha, src, name, e.timeout_us,
                                           inputs, 0, buffer));
  }
  return finish(fbb, wire::Body::Evaluate,
                wire::CreateEvaluate(fbb, fbb.CreateVector(items)).Union());
}

// An Evaluate frame whose input map has keys and items of different lengths (only a broken or
// hostile host sends one; the worker answers InvalidArgument).
ByteVec evaluate_bad_inputs() {
  flatbuffers::FlatBufferBuilder fbb(256);
  protocol::WireValueBuilder b(fbb);
  const auto one = b.integer(1);
  const auto items = fbb.CreateVector(std::vector<Ref>{one, one});
  const auto keys = fbb.CreateVectorOfStrings(std::vector<std::string>{"k"});
  const auto bad = wire::CreateValue(fbb, wire::ValueKind::Map, false, 0, 0, 0, 0, items, keys);
  const auto in = wire::CreateInput(fbb, fbb.CreateString("a"), bad);
  const auto inputs = fbb.CreateVector(&in, 1);
  const auto e = wire::CreateEvaluation(fbb, 99, 1, 0, 0, 0, 1000, inputs);
  return finish(fbb, wire::Body::Evaluate,
                wire::CreateEvaluate(fbb, fbb.CreateVector(&e, 1)).Union());
}

// Choices a target reads from the back of its input with FuzzedDataProvider: each value is
// written as ConsumeIntegralInRange(min, max) reads it (big-endian from the last byte back, as
// many bytes as max - min needs).
class Tail {
 public:
  Tail& pick(uint64_t value_minus_min, uint64_t range) {
    int n = 0;
    while (n < 8 && (range >> (8 * n)) > 0) ++n;
    for (int i = n - 1; i >= 0; --i)
      order_.push_back(static_cast<uint8_t>(value_minus_min >> (8 * i)));
    return *this;
  }
  ByteVec after(const ByteVec& front) const {
    ByteVec out = front;
    out.insert(out.end(), order_.rbegin(), order_.rend());
    return out;
  }

 private:
  ByteVec order_;
};

constexpr uint64_t kId0 = uint64_t{1} << 32;

// fuzz_frame_reader: bound (6 choices), capacity (5), fd, pieces (1..64), cuts (0..65536).
ByteVec reader_seed(const ByteVec& stream, int bound, int capacity, bool fd,
                    std::vector<uint64_t> cuts) {
  Tail t;
  t.pick(bound, 5).pick(capacity, 4).pick(fd, 255).pick(cuts.size() - 1, 63);
  for (auto c : cuts) t.pick(c, 65536);
  return t.after(stream);
}

// fuzz_host_results: slots (0..16), pieces (0..16), cuts (1..16384).
ByteVec host_seed(const ByteVec& stream, int slots, std::vector<uint64_t> cuts) {
  Tail t;
  t.pick(slots, 16).pick(cuts.size(), 16);
  for (auto c : cuts) t.pick(c - 1, 16383);
  return t.after(stream);
}

// ---- client -> daemon frames (fuzz_daemon_client; design/protocol.md, "Client frames") ----

ByteVec client_hello(uint16_t version = protocol::kProtocolVersion) {
  flatbuffers::FlatBufferBuilder fbb(128);
  return finish(fbb, wire::Body::ClientHello,
                wire::CreateClientHello(fbb, version, fbb.CreateString("fuzz")).Union());
}

ByteVec reg(uint64_t request_id, const char* key, const char* source) {
  flatbuffers::FlatBufferBuilder fbb(256);
  const auto k = key ? fbb.CreateString(key) : flatbuffers::Offset<flatbuffers::String>();
  const auto s = source ? fbb.CreateString(source) : flatbuffers::Offset<flatbuffers::String>();
  return finish(fbb, wire::Body::Register, wire::CreateRegister(fbb, request_id, k, s).Union());
}

ByteVec control(uint64_t request_id, wire::ControlCommand command, int32_t shard = 0) {
  flatbuffers::FlatBufferBuilder fbb(64);
  return finish(fbb, wire::Body::Control,
                wire::CreateControl(fbb, request_id, command, shard).Union());
}

// ListScripts with its paging fields (design/protocol.md "Paged ListScripts").
ByteVec list_page(uint64_t request_id, std::string_view after, uint32_t limit) {
  flatbuffers::FlatBufferBuilder fbb(128);
  const auto a = fbb.CreateString(after.data(), after.size());
  return finish(
      fbb, wire::Body::Control,
      wire::CreateControl(fbb, request_id, wire::ControlCommand::ListScripts, 0, a, limit).Union());
}

// The tags frames (design/protocol.md "Tags frames"), for the seeds of the attacks bounded in
// design/daemon.md "Tags bounds".
template <class Build>
ByteVec tags_frame(Build&& build) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  const auto frame = build(fbb);
  return ByteVec(frame.begin(), frame.end());
}

// SourceUpdates of `ids`, each a string value of `value_bytes` bytes, with `status`.
ByteVec source_updates(uint64_t request_id, const std::vector<std::string>& ids,
                       std::size_t value_bytes, uint32_t status = 0) {
  return tags_frame([&](flatbuffers::FlatBufferBuilder& f) {
    std::vector<flatbuffers::Offset<wire::TagValue>> items;
    for (const auto& id : ids) {
      const auto str = f.CreateString(std::string(value_bytes, 'v'));
      const auto v = wire::CreateValue(f, wire::ValueKind::String, false, 0, 0, str);
      const auto dv = wire::CreateDataValue(f, v, status);
      items.push_back(wire::CreateTagValue(f, f.CreateString(id), dv));
    }
    return protocol::encode_source_updates(f, request_id, 0, items);
  });
}

ByteVec unreg(uint64_t request_id, const char* key) {
  flatbuffers::FlatBufferBuilder fbb(64);
  const auto k = key ? fbb.CreateString(key) : flatbuffers::Offset<flatbuffers::String>();
  return finish(fbb, wire::Body::Unregister, wire::CreateUnregister(fbb, request_id, k).Union());
}

// A client evaluation: id chosen by the client, script_id = the handle (fuzz_daemon_client's
// daemon registers its fixed scripts as handles 0..7 before the first input).
Eval call(uint64_t id, uint32_t handle, Inputs inputs = {}) {
  return Eval{id, handle, nullptr, 0, std::move(inputs)};
}
Eval encoded_call(uint64_t id, uint32_t handle, Inputs inputs) {
  return Eval{id, handle, nullptr, 0, std::move(inputs), true};
}

// One input nested `depth` arrays deep, built raw (encode_inputs refuses more than 32).
ByteVec evaluate_nested(uint32_t handle, int depth) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  protocol::WireValueBuilder b(fbb);
  Ref v = b.integer(1);
  for (int i = 0; i < depth; ++i)
    v = wire::CreateValue(fbb, wire::ValueKind::Array, false, 0, 0, 0, 0,
                          fbb.CreateVector(std::vector<Ref>{v}));
  const auto in = wire::CreateInput(fbb, fbb.CreateString("deep"), v);
  const auto e = wire::CreateEvaluation(fbb, 4, handle, 0, 0, 0, 0, fbb.CreateVector(&in, 1));
  return finish(fbb, wire::Body::Evaluate,
                wire::CreateEvaluate(fbb, fbb.CreateVector(&e, 1)).Union());
}

// One input whose value is a binary tree of `depth` levels built from one shared subtree per
// level: a few hundred bytes on the wire, 2^depth leaves once decoded.
ByteVec evaluate_shared_subtrees(uint32_t handle, int depth) {
  flatbuffers::FlatBufferBuilder fbb(1024);
  protocol::WireValueBuilder b(fbb);
  Ref v = b.integer(7);
  for (int i = 0; i < depth; ++i)
    v = wire::CreateValue(fbb, wire::ValueKind::Array, false, 0, 0, 0, 0,
                          fbb.CreateVector(std::vector<Ref>{v, v}));
  const auto in = wire::CreateInput(fbb, fbb.CreateString("tree"), v);
  const auto e = wire::CreateEvaluation(fbb, 5, handle, 0, 0, 0, 0, fbb.CreateVector(&in, 1));
  return finish(fbb, wire::Body::Evaluate,
                wire::CreateEvaluate(fbb, fbb.CreateVector(&e, 1)).Union());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
    return 2;
  }
  g_dir = argv[1];

  const Value sample = sample_value();
  const Value i42(int64_t{42}), deep32 = nested(32), deep33 = nested(33);
  const ByteVec results_mixed =
      results({{kId0 | 0, wire::Status::Ok, &sample, nullptr},
               {kId0 | 1, wire::Status::RuntimeError, nullptr, "Line1.Avg:1: attempt to add"},
               {kId0 | 2, wire::Status::NeedSource, nullptr, nullptr},
               {kId0 | 3, wire::Status::Ok, &deep32, nullptr}});
  const ByteVec results_one = results({{kId0 | 0, wire::Status::Ok, &i42, nullptr}});
  const ByteVec eval_basic =
      evaluate({{kId0 | 0,
                 0,
                 "return (inputs.a + inputs.b) / 2",
                 100000,
                 {{"a", Value(1)}, {"b", Value(2)}}},
                {kId0 | 1, 0, nullptr, 100000, {{"a", Value(3)}, {"b", Value(4.5)}}}});

  // ---- fuzz_frame_reader -----------------------------------------------------------------
  const ByteVec worker_stream = cat({hello(), results_mixed, shutdown(), results_one});
  write_seed("fuzz_frame_reader", "worker_stream_append",
             reader_seed(worker_stream, 0, 0, false, {5, 17, 100}));
  write_seed("fuzz_frame_reader", "worker_stream_fd",
             reader_seed(worker_stream, 0, 1, true, {3, 64, 1}));
  write_seed("fuzz_frame_reader", "host_stream",
             reader_seed(cat({eval_basic, shutdown(), eval_basic}), 0, 2, false, {1}));
  write_seed("fuzz_frame_reader", "small_bound",
             reader_seed(cat({hello(), results_one}), 4, 0, true, {7}));
  write_seed("fuzz_frame_reader", "undersized",
             reader_seed(cat({hello(), ByteVec{4, 0, 0, 0, 1, 2, 3, 4}}), 0, 0, false, {2}));
  write_seed("fuzz_frame_reader", "oversized",
             reader_seed(cat({hello(), ByteVec{0, 0, 0, 2, 1, 2}}), 0, 4, false, {9}));

  {
    // Client <-> daemon frames share the framing and the schema (design/daemon.md).
    flatbuffers::FlatBufferBuilder a(256), b(256), c(256);
    const ByteVec client_hello = finish(
        a, wire::Body::ClientHello,
        wire::CreateClientHello(a, protocol::kProtocolVersion, a.CreateString("fuzz")).Union());
    const ByteVec reg =
        finish(b, wire::Body::Register,
               wire::CreateRegister(b, 7, b.CreateString("Line1.Avg"), b.CreateString("return 1"))
                   .Union());
    const ByteVec control = finish(
        c, wire::Body::Control, wire::CreateControl(c, 8, wire::ControlCommand::Stats, 0).Union());
    write_seed("fuzz_frame_reader", "client_stream",
               reader_seed(cat({client_hello, reg, control, eval_basic}), 0, 3, true, {11, 2}));
  }

  // ---- fuzz_host_results -----------------------------------------------------------------
  write_seed("fuzz_host_results", "mixed",
             host_seed(cat({hello(), results_mixed, results_one}), 4, {13, 200}));
  write_seed("fuzz_host_results", "one_by_one", host_seed(cat({hello(), results_one}), 1, {1}));
  write_seed(
      "fuzz_host_results", "too_deep",
      host_seed(cat({hello(), results({{kId0, wire::Status::Ok, &deep33, nullptr}})}), 1, {}));
  write_seed("fuzz_host_results", "before_hello", host_seed(cat({results_one, hello()}), 1, {}));
  write_seed("fuzz_host_results", "bad_version", host_seed(hello(2), 0, {}));
  write_seed(
      "fuzz_host_results", "host_status",
      host_seed(cat({hello(), results({{kId0, wire::Status::Killed, nullptr, "no"}})}), 1, {}));
  write_seed("fuzz_host_results", "need_source_twice",
             host_seed(cat({hello(), results({{kId0, wire::Status::NeedSource, nullptr, nullptr}}),
                            results({{kId0, wire::Status::NeedSource, nullptr, nullptr}})}),
                       1, {}));

  // ---- fuzz_worker_input -----------------------------------------------------------------
  write_seed("fuzz_worker_input", "basic", eval_basic);
  write_seed("fuzz_worker_input", "encoded_inputs",
             evaluate({{kId0 | 0,
                        0,
                        "return (inputs.a + inputs.b) / 2",
                        100000,
                        {{"a", Value(1)}, {"b", Value(2.5)}},
                        true},
                       {kId0 | 1, 0, nullptr, 100000, {{"a", Value(3)}}, true}}));
  write_seed(
      "fuzz_worker_input", "statuses",
      evaluate({{1,
                 1,
                 "return {x = inputs.x, n = #inputs.t, s = inputs.s}",
                 1000,
                 {{"x", sample}, {"t", Value(Array{Value(1), Value(2)})}, {"s", Value("é")}}},
                {2, 2, "return (", 1000, {}},
                {3, 3, "error('boom')", 1000, {}},
                {4, 4, "while true do end", 1000, {}},
                {5, 5, "local t = {} for i = 1, 1e9 do t[i] = ('x'):rep(64) end", 1000, {}},
                {6, 6, "return function() end", 1000, {}},
                {7, 77, nullptr, 1000, {}},
                {8, 1u << 22, nullptr, 1000, {}},
                {9, 1, nullptr, 1000, {{"x", deep32}}}}));
  write_seed("fuzz_worker_input", "shutdown_then_more", cat({eval_basic, shutdown(), eval_basic}));
  write_seed("fuzz_worker_input", "bad_inputs", cat({eval_basic, evaluate_bad_inputs()}));
  write_seed("fuzz_worker_input", "garbage_after",
             cat({eval_basic, ByteVec{16, 0, 0, 0, 1, 2, 3}, ByteVec(13, 0xee)}));
  write_seed("fuzz_worker_input", "results_to_worker", cat({hello(), results_one, eval_basic}));
  write_seed("fuzz_worker_input", "replace_source",
             cat({evaluate({{1, 9, "return 1", 1000, {}}}),
                  evaluate({{2, 9, "return inputs.v", 1000, {{"v", deep32}}}})}));

  write_seed("fuzz_worker_input", "huge_timeouts",  // tests/protocol/fuzz_regressions_test.cpp
             evaluate({{1,
                        0,
                        "local n = 0 for i = 1, 100000 do n = n + i end return n",
                        std::numeric_limits<uint64_t>::max(),
                        {}},
                       {2, 0, nullptr, uint64_t{1} << 62, {}}}));

  // ---- fuzz_value_decode -----------------------------------------------------------------
  auto raw = [](const Value& v) {
    flatbuffers::FlatBufferBuilder fbb(256);
    fbb.Finish(detail::encode_value(fbb, v));
    ByteVec b{0};
    b.insert(b.end(), fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
    return b;
  };
  write_seed("fuzz_value_decode", "raw_sample", raw(sample));
  write_seed("fuzz_value_decode", "raw_deep32", raw(deep32));
  write_seed("fuzz_value_decode", "raw_deep33", raw(deep33));
  write_seed("fuzz_value_decode", "raw_string", raw(Value("hello")));
  {
    // A map whose keys and items differ in length.
    flatbuffers::FlatBufferBuilder fbb(256);
    protocol::WireValueBuilder b(fbb);
    const auto items = fbb.CreateVector(std::vector<Ref>{b.integer(1)});
    fbb.Finish(wire::CreateValue(fbb, wire::ValueKind::Map, false, 0, 0, 0, 0, items));
    ByteVec s{0};
    s.insert(s.end(), fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
    write_seed("fuzz_value_decode", "raw_bad_map", s);
  }
  // Programs (odd first byte): a byte pattern the builder reads as a mix of operations.
  for (int i = 0; i < 4; ++i) {
    ByteVec p{1};
    for (int j = 0; j < 48 + 16 * i; ++j) p.push_back(static_cast<uint8_t>(j * (7 + 2 * i) + i));
    write_seed("fuzz_value_decode", "program" + std::to_string(i), p);
  }
  // ---- fuzz_daemon_client ----------------------------------------------------------------
  {
    using C = wire::ControlCommand;
    const char* T = "fuzz_daemon_client";
    const Inputs ab{{"a", Value(1)}, {"b", Value(2.5)}};
    write_seed(T, "basic",
               cat({client_hello(), reg(1, "fuzz.sum", "return (inputs.a or 0) + (inputs.b or 0)"),
                    evaluate({call(10, 0, ab)}), control(2, C::Stats)}));
    write_seed(
        T, "every_handle",  // one batch: over max_inflight (4), unknown handles
        cat({client_hello(), evaluate({call(1, 0, ab), call(2, 1, {{"x", sample}}), call(3, 2),
                                       call(4, 3), call(5, 4), call(6, 5), call(7, 6), call(8, 7),
                                       call(9, 99), call(10, 1u << 22), call(11, 0xffffffff)})}));
    ByteVec one_by_one = client_hello();
    for (uint32_t h = 0; h < 9; ++h) one_by_one = cat({one_by_one, evaluate({call(h, h, ab)})});
    write_seed(T, "one_by_one", one_by_one);
    write_seed(T, "controls",
               cat({client_hello(), control(1, C::Stats), control(2, C::Shards),
                    control(3, C::ListScripts), control(4, C::KillShard, 99),
                    control(5, C::RestartShard, -1), control(6, static_cast<C>(7), 0)}));
    write_seed(T, "register",
               cat({client_hello(), reg(1, "Line1.Avg", "return (inputs.a + inputs.b) / 2"),
                    reg(2, "Line1.Avg", "return (inputs.a + inputs.b) / 2"),
                    reg(3, "Line1.Avg", "return inputs.a"), reg(4, "", "return 1"),
                    reg(5, "Line1.NoSource", nullptr), reg(6, nullptr, nullptr),
                    reg(7, "fuzz.echo", "return inputs"), evaluate({call(1, 8, ab), call(2, 9)}),
                    control(8, C::ListScripts)}));
    write_seed(T, "replaced_key",  // the key's latest source decides; found by the fuzzer (harness)
               cat({client_hello(), reg(1, "fuzz.sum", "return 2"),
                    reg(2, "fuzz.sum", "return (inputs.a or 0) + (inputs.b or 0)"),
                    reg(3, "fuzz.sum", "return (inputs.a or 0) + (inputs.b or 0)"),
                    evaluate({call(1, 0, ab)})}));
    write_seed(
        T,
        "invalid_utf8_key",  // ListScripts threw in json::dump (outrund ended); found by the fuzzer
        cat({client_hello(), reg(1, "Line1.\xff\xfe", "return 1"), control(2, C::ListScripts),
             control(3, C::Stats)}));
    write_seed(
        T, "paged_list",  // pages of 1 and 2 by cursor (keys "fuzz.sum", "Line1.Avg"...)
        cat({client_hello(), reg(1, "Line1.Avg", "return 1"), reg(2, "Line1.Min", "return 2"),
             list_page(3, "", 1), list_page(4, "4c696e65312e417667:1", 2),
             list_page(5, "4c696e65312e417667:0", 0), list_page(6, "ff:0", 10),
             list_page(7, "4c:4294967295", 4294967295u), control(8, C::ListScripts)}));
    write_seed(
        T, "paged_list_bad_cursors",  // invalid_argument each, the connection goes on
        cat({client_hello(), list_page(1, "zz", 1), list_page(2, "abc", 0), list_page(3, ":1", 0),
             list_page(4, "4c:", 0), list_page(5, "4C:0", 0), list_page(6, "4c:99999999999", 0),
             list_page(7, std::string(520, 'a') + ":0", 0),
             list_page(8, std::string("4c\0:0", 5), 0), control(9, C::Stats)}));
    write_seed(T, "unregister",  // a key goes, its handle ends invalid_argument, it comes back
               cat({client_hello(), reg(1, "Line1.Gone", "return 1"), evaluate({call(1, 8)}),
                    unreg(2, "Line1.Gone"), evaluate({call(2, 8)}), unreg(3, "Line1.Gone"),
                    unreg(4, nullptr), unreg(5, "fuzz.sum"), evaluate({call(3, 0, ab)}),
                    reg(6, "Line1.Gone", "return 2"), evaluate({call(4, 8)})}));
    write_seed(T, "repeated_ids",  // ids are the client's: one id, a good and an impossible handle
               cat({client_hello(), evaluate({call(7, 0, ab), call(7, 1u << 22), call(7, 1)})}));
    write_seed(T, "single_flight",  // the same looping script again and again: busy
               cat({client_hello(), evaluate({call(1, 2), call(2, 2), call(3, 2)}),
                    evaluate({call(4, 2)}), evaluate({call(4, 2)})}));
    write_seed(T, "values",
               cat({client_hello(), evaluate({call(1, 1, {{"v", deep32}})}), evaluate_nested(1, 33),
                    evaluate_bad_inputs(), evaluate_shared_subtrees(1, 12)}));
    write_seed(T, "mixed",  // the daemon ignores source, sha256, chunk_name and timeout_us
               cat({client_hello(), eval_basic, reg(1, "fuzz.global", "n = (n or 0) + 1 return n"),
                    evaluate({call(3, 6), call(4, 0, ab)}), control(2, C::Shards),
                    evaluate({{5, 0, "while true do end", ~uint64_t{0}, {}}})}));
    write_seed(T, "partial_end",
               cat({client_hello(), evaluate({call(1, 0, ab)}), ByteVec{40, 0, 0, 0, 1, 2, 3}}));
    // Each breaks a rule: the daemon closes this connection (after a ServerHello{error} for the
    // version), answering nothing after it.
    write_seed(T, "no_hello", cat({reg(1, "fuzz.sum", "return 1"), client_hello()}));
    write_seed(T, "bad_version", cat({client_hello(3), control(1, C::Stats)}));
    write_seed(T, "protocol_1",  // answered in version 1, plain inputs
               cat({client_hello(1), evaluate({call(1, 0, ab)}), control(1, C::Stats)}));
    // The tags frames at the shapes of the attacks design/daemon.md "Tags bounds" bounds, small.
    {
      std::string chain;  // c0 <- c1 <- ... <- c399 <- src
      for (int i = 0; i < 400; ++i)
        chain += "[[tag]]\nid = \"c" + std::to_string(i) + "\"\ninputs = [{tag = \"" +
                 (i + 1 < 400 ? "c" + std::to_string(i + 1) : std::string("src")) +
                 "\", name = \"x\"}]\nscript = \"return inputs.x\"\n";
      const std::vector<std::string> c0{"c0"}, src{"src"};
      write_seed(T, "tags_deep_chain",  // a Bad source passed down the chain, then a Good one
                 cat({client_hello(), tags_frame([&](auto& f) {
                        return protocol::encode_define_tags(f, 1, chain, false);
                      }),
                      source_updates(2, src, 1, 0x808C0000u),
                      tags_frame([&](auto& f) { return protocol::encode_read_tags(f, 3, c0); }),
                      source_updates(4, src, 1), tags_frame([&](auto& f) {
                        return protocol::encode_list_tags(f, 5, "c3", 2);
                      })}));
      std::vector<std::string> wide;  // new ids of 200 bytes
      for (int i = 0; i < 200; ++i) {
        std::string id = "s" + std::to_string(i);
        id.resize(200, '_');
        wide.push_back(id);
      }
      write_seed(T, "tags_source_flood",  // many new ids, then one id with ever new large values
                 cat({client_hello(), source_updates(1, wide, 8),
                      source_updates(0, {"big1"}, 40000), source_updates(0, {"big2"}, 40000),
                      source_updates(2, {"big1"}, 20000), control(3, C::Stats)}));
      std::vector<std::string> unknown;
      for (int i = 0; i < 1024; ++i) unknown.push_back("nothing." + std::to_string(i));
      write_seed(
          T, "tags_subscribe_unknown",  // ids that name no tag, again and again, cancelled
          cat({client_hello(), tags_frame([&](auto& f) {
                 return protocol::encode_subscribe(f, 1, unknown, false);
               }),
               tags_frame(
                   [&](auto& f) { return protocol::encode_subscribe(f, 2, unknown, false); }),
               tags_frame([&](auto& f) { return protocol::encode_subscribe(f, 3, {}, true); })}));
      const std::vector<std::string> big_many(100, "big");
      write_seed(T, "tags_read_big",  // one 200 KB source read 100 times: past a frame
                 cat({client_hello(), source_updates(1, {"big"}, 200000), tags_frame([&](auto& f) {
                        return protocol::encode_read_tags(f, 2, big_many);
                      }),
                      tags_frame([&](auto& f) { return protocol::encode_read_tags(f, 3, src); })}));
      std::string some;
      for (int i = 0; i < 30; ++i)
        some += "[[tag]]\nid = \"t" + std::to_string(i) +
                "\"\ninputs = [\"s\"]\nscript = " + "\"return inputs.s\"\n";
      write_seed(
          T, "tags_list_pages",  // pages by cursor; a cursor that names nothing
          cat({client_hello(),
               tags_frame([&](auto& f) { return protocol::encode_define_tags(f, 1, some, false); }),
               tags_frame([&](auto& f) { return protocol::encode_list_tags(f, 2, "", 10); }),
               tags_frame([&](auto& f) { return protocol::encode_list_tags(f, 3, "t9", 10); }),
               tags_frame([&](auto& f) { return protocol::encode_list_tags(f, 4, "nope", 1); }),
               tags_frame([&](auto& f) { return protocol::encode_list_tags(f, 5, "", 0); })}));
      const std::vector<std::string> r0_many(256, "r0");
      ByteVec flood = cat({client_hello(), tags_frame([&](auto& f) {
                             return protocol::encode_define_tags(
                                 f, 1,
                                 "[[tag]]\nid = \"r0\"\ninputs = [\"x\"]\ntrigger = \"on_read\"\n"
                                 "max_age_ms = 1\nscript = \"return inputs.x\"\n",
                                 false);
                           }),
                           source_updates(2, {"x"}, 4)});
      for (uint64_t r = 3; r < 19; ++r)
        flood =
            cat({flood,
                 tags_frame([&](auto& f) { return protocol::encode_read_tags(f, r, r0_many); })});
      write_seed(T, "tags_on_read_flood", flood);  // one on_read tag named 256 times, 16 reads
    }
    write_seed(T, "encoded_inputs",  // protocol 2's inputs_buffer, beside plain inputs
               cat({client_hello(), evaluate({encoded_call(1, 0, ab), call(2, 0, ab)}),
                    evaluate({encoded_call(3, 1, {{"v", deep32}}), encoded_call(4, 0, {})})}));
    write_seed(T, "second_hello", cat({client_hello(), control(1, C::Stats), client_hello()}));
    write_seed(T, "results_from_client", cat({client_hello(), results_one, control(1, C::Stats)}));
    write_seed(T, "worker_frames",
               cat({client_hello(), evaluate({call(1, 2)}), hello(), shutdown()}));
    write_seed(T, "garbage_after",
               cat({client_hello(), evaluate({call(1, 0, ab)}), ByteVec{16, 0, 0, 0, 1, 2, 3},
                    ByteVec(13, 0xee)}));
    write_seed(T, "oversized", cat({client_hello(), ByteVec{0, 0, 0, 2, 1, 2}}));
    write_seed(T, "undersized", cat({client_hello(), ByteVec{4, 0, 0, 0, 1, 2, 3, 4}}));
  }

  std::printf("seeds written to %s\n", g_dir.c_str());
  return 0;
}
