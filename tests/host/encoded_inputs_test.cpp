// EncodedInputs through the public API (design/protocol.md "Encoded inputs", D-encoded-inputs):
// what `from` accepts and refuses, and a batch with encoded inputs through a Host with real
// workers (also re-sent after its worker is killed) and through InProcess, against the same
// batch with plain inputs.
#include <doctest/doctest.h>
#include <flatbuffers/flatbuffers.h>

#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "host/host_support.h"
#include "outrun/in_process.h"
#include "outrun/protocol/input_list.h"
#include "outrun/protocol/outrun_generated.h"
#include "outrun/protocol/wire_value.h"
#include "wire_codec.h"

using namespace outrun;
using namespace std::chrono_literals;

namespace {

std::string bytes_of(const flatbuffers::FlatBufferBuilder& f) {
  return {reinterpret_cast<const char*>(f.GetBufferPointer()), f.GetSize()};
}

// `inputs` as an InputList FlatBuffer, as a client encodes them.
std::string encode(const Inputs& inputs) {
  flatbuffers::FlatBufferBuilder f;
  std::span<const uint8_t> bytes;
  std::string err;
  REQUIRE(detail::encode_input_list(f, inputs, &bytes, &err));
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

EncodedInputs encoded(const Inputs& inputs) {
  EncodedInputs e;
  const Error err = EncodedInputs::from(encode(inputs), &e);
  REQUIRE_MESSAGE(!err, err.message);
  return e;
}

// One input `x` whose value is built by `make` in the list's own builder.
template <typename Make>
std::string list_with(Make make) {
  flatbuffers::FlatBufferBuilder f;
  const auto v = make(f);
  const auto name = f.CreateString("x");
  std::vector<flatbuffers::Offset<wire::Input>> in{wire::CreateInput(f, name, v)};
  f.Finish(wire::CreateInputList(f, f.CreateVector(in)));
  return bytes_of(f);
}

Error from(const std::string& bytes) {
  EncodedInputs e;
  Error err = EncodedInputs::from(bytes, &e);
  CHECK(e.empty() == (static_cast<bool>(err) || bytes.empty()));
  return err;
}

const char* kScript =
    "return inputs.a + inputs.b * 10 + #inputs.s + inputs.t[2] + inputs.m.k + (inputs.n or 0)";

Inputs sample(int64_t a) {
  Map m;
  m.push_back({"k", Value(int64_t{1000})});
  return {{"a", Value(a)},
          {"b", Value(2.5)},
          {"s", Value(std::string("xyz"))},
          {"t", Value(Array{Value(int64_t{1}), Value(int64_t{100})})},
          {"m", Value(std::move(m))}};
}

double expected(int64_t a) {
  return static_cast<double>(a) + 25 + 3 + 100 + 1000;
}

}  // namespace

TEST_CASE("EncodedInputs::from takes a valid InputList and refuses the rest with a reason") {
  CHECK(!from(""));  // no inputs
  CHECK(!from(encode(sample(1))));
  CHECK(!from(list_with([](auto& f) { return protocol::WireValueBuilder(f).integer(1); })));

  Error e = from("definitely not a flatbuffer");
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK(e.message.find("not a valid InputList") != std::string::npos);
  CHECK(from(std::string(protocol::kMaxInputListBytes + 1, 'x')).message.find("larger than") !=
        std::string::npos);

  // A tag-only kind (UInt) is not an input.
  e = from(list_with([](auto& f) {
    wire::ValueBuilder b(f);
    b.add_kind(wire::ValueKind::UInt);
    b.add_uint_value(7);
    return b.Finish();
  }));
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK(e.message.find("input 'x' is not a valid value") != std::string::npos);

  // 33 nested arrays: one too deep.
  e = from(list_with([](auto& f) {
    protocol::WireValueBuilder b(f);
    auto v = b.integer(1);
    for (int i = 0; i < 33; ++i) v = b.array(std::vector{v});
    return v;
  }));
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK(!from(list_with([](auto& f) {
    protocol::WireValueBuilder b(f);
    auto v = b.integer(1);
    for (int i = 0; i < 32; ++i) v = b.array(std::vector{v});
    return v;
  })));

  // 14 levels of an array holding its child twice, over one 1000-byte string: 2^14 uses of it in
  // about 1 KiB. Counted per use, that is over kMaxInputBytes.
  e = from(list_with([](auto& f) {
    protocol::WireValueBuilder b(f);
    auto v = b.string(std::string(1000, 's'), true);
    for (int i = 0; i < 14; ++i) v = b.array(std::vector{v, v});
    return v;
  }));
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK(e.message.find("larger than 8388608") != std::string::npos);

  // More than kMaxInputs inputs.
  Inputs many;
  for (std::size_t i = 0; i <= kMaxInputs; ++i) many.push_back({"i" + std::to_string(i), Value()});
  flatbuffers::FlatBufferBuilder f;
  std::vector<flatbuffers::Offset<wire::Input>> offs;
  for (const auto& in : many) offs.push_back(wire::CreateInput(f, f.CreateString(in.name)));
  f.Finish(wire::CreateInputList(f, f.CreateVector(offs)));
  e = from(bytes_of(f));
  CHECK(e.message.find("too many inputs") != std::string::npos);
}

namespace {

std::unique_ptr<Host> start(int shards, SingleFlight single_flight) {
  HostOptions o;
  o.worker_path = OUTRUN_TEST_WORKER;
  o.shards = shards;
  o.timeout = 20s;
  o.single_flight = single_flight;
  return test::start_host(o);
}

// Submits `batch` as one evaluate_batch; the results by request index.
std::vector<std::future<Result>> submit(Runner& r, std::vector<Request> batch) {
  auto got = std::make_shared<std::vector<std::promise<Result>>>(batch.size());
  std::vector<std::future<Result>> out;
  for (auto& p : *got) out.push_back(p.get_future());
  r.evaluate_batch(std::move(batch),
                   [got](std::size_t i, Result res) { (*got)[i].set_value(std::move(res)); });
  return out;
}

// Three requests of `s` with encoded sample(0), sample(1), sample(2).
std::vector<Request> three_encoded(const Script& s) {
  std::vector<Request> batch;
  for (int64_t i = 0; i < 3; ++i) batch.push_back(Request{s, {}, encoded(sample(i))});
  return batch;
}

}  // namespace

TEST_CASE("Host and InProcess: a batch with encoded inputs gives what the same plain batch gives") {
  auto host = start(2, SingleFlight::off);
  InProcess inproc;
  for (Runner* r : {static_cast<Runner*>(host.get()), static_cast<Runner*>(&inproc)}) {
    const Script s = test::reg(*r, "enc.sum", kScript);
    std::vector<Request> plain, enc;
    for (int64_t i = 0; i < 50; ++i) {
      plain.push_back(Request{s, sample(i)});
      enc.push_back(Request{s, {{"ignored", Value(int64_t{1})}}, encoded(sample(i))});
    }
    // Encoded and plain in one batch, too: each its own way.
    enc.push_back(Request{s, sample(7)});
    plain.push_back(Request{s, sample(7)});
    auto a = submit(*r, std::move(plain));
    auto b = submit(*r, std::move(enc));
    for (std::size_t i = 0; i < a.size(); ++i) {
      const Result x = a[i].get(), y = b[i].get();
      INFO(i, " ", y.error);
      REQUIRE(y.status == Status::ok);
      CHECK(x.value == y.value);
      CHECK(y.value == Value(expected(i == 50 ? 7 : static_cast<int64_t>(i))));
    }
  }
}

TEST_CASE("Host: encoded inputs are re-sent as they are after their worker is killed") {
  auto host = start(1, SingleFlight::off);
  const Script s = test::reg(
      *host, "enc.slow",
      "local t = os.clock() while os.clock() - t < 0.3 do end return inputs.a + inputs.m.k");
  auto got = submit(*host, three_encoded(s));
  std::this_thread::sleep_for(100ms);  // the first one runs
  const uint64_t retried = host->shard_stats(0).retried;
  REQUIRE(!host->kill_shard(0));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const Result r = got[i].get();
    INFO(i, " ", r.error);
    REQUIRE(r.status == Status::ok);
    CHECK(r.value == Value(static_cast<int64_t>(i) + 1000));
  }
  CHECK(host->shard_stats(0).retried >= retried + 3);  // all three were sent when it died
}

TEST_CASE("Host: encoded inputs of a key already in flight (single flight) wait with their bytes") {
  auto host = start(1, SingleFlight::coalesce_latest);
  const Script s = test::reg(
      *host, "enc.coalesce",
      "local t = os.clock() while os.clock() - t < 0.05 do end return inputs.a + inputs.m.k");
  // The second and third take the one-by-one path (their key is in flight): the third replaces
  // the second (busy) and runs after the first with its own inputs.
  auto got = submit(*host, three_encoded(s));
  const Result a = got[0].get(), b = got[1].get(), c = got[2].get();
  CHECK(a.value == Value(int64_t{1000}));
  CHECK(b.status == Status::busy);
  INFO(c.error);
  CHECK(c.value == Value(int64_t{1002}));
}

TEST_CASE(
    "Host: a batch of scripts the worker lacks, each with a large source, never makes a "
    "frame past the limit") {
  auto host = start(1, SingleFlight::off);
  // 24 scripts of 900 KB (a string constant: the same size as bytecode), first evaluated in one
  // batch: 21 MB of sources and bytecode, more than one frame may hold.
  std::vector<Request> batch;
  for (int i = 0; i < 24; ++i) {
    const std::string src = "local s = '" + std::string(900'000, static_cast<char>('a' + i % 26)) +
                            "' return #s + " + std::to_string(i);
    batch.push_back(Request{test::reg(*host, "big." + std::to_string(i), src), {}});
  }
  auto got = submit(*host, std::move(batch));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const Result r = got[i].get();
    INFO(i, " ", r.error);
    CHECK(r.value == Value(static_cast<int64_t>(900'000 + i)));
  }
  CHECK(host->shard_stats(0).deaths == 0);  // no worker ended on an oversized frame
}
