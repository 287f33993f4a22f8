// outrund at the protocol edge for evaluation inputs (design/protocol.md "Encoded inputs",
// "Versions"): raw frames on a real daemon. Protocol 2's Evaluation.inputs_buffer, passed to the
// worker as it is, and protocol 1's `inputs` give the same results; bad encoded inputs end that
// one evaluation invalid_argument with a reason, a nested buffer that does not verify too (the
// connection goes on); a frame that uses one nested buffer many times pays for every use, in
// the walk and in the bytes copied.
#include <doctest/doctest.h>
#include <flatbuffers/flatbuffers.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "daemon_support.h"
#include "outrun/client.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/wire_value.h"

namespace {

using namespace outrun::test;
namespace wire = outrun::wire;
namespace protocol = outrun::protocol;
using Builder = flatbuffers::FlatBufferBuilder;
using ValueRef = flatbuffers::Offset<wire::Value>;

struct Conn {
  int fd = -1;
  protocol::FrameReader reader;
  uint16_t version = 0;  // ServerHello's
  std::string refused;   // ServerHello's error

  Conn(const std::string& path, uint16_t hello_version) {
    fd = connect_raw(path);
    Builder f;
    send(protocol::encode_client_hello(f, "inputs-test", hello_version));
    const auto fv = next();
    REQUIRE(fv.frame->body_type() == wire::Body::ServerHello);
    version = fv.frame->body_as_ServerHello()->protocol_version();
    if (const auto* e = fv.frame->body_as_ServerHello()->error()) refused = e->str();
  }
  ~Conn() { close(fd); }
  void send(std::span<const uint8_t> b) {
    for (std::size_t off = 0; off < b.size();) {
      const ssize_t n = write(fd, b.data() + off, b.size() - off);
      REQUIRE(n > 0);
      off += static_cast<std::size_t>(n);
    }
  }
  protocol::FrameView next() {  // valid until the next call
    protocol::FrameView fv;
    while (!reader.next(fv)) REQUIRE(reader.read_from(fd) > 0);
    return fv;
  }
  // True when the daemon closed the connection (within the receive timeout).
  bool closed() {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }
  uint32_t register_script(const std::string& key, const std::string& source) {
    Builder f;
    send(protocol::encode_register(f, 1, key, source));
    const auto fv = next();
    REQUIRE(fv.frame->body_type() == wire::Body::Registered);
    REQUIRE(fv.frame->body_as_Registered()->status() == wire::Status::Ok);
    return fv.frame->body_as_Registered()->handle();
  }
  // Results until `n` are read, by id: {status, value as a double (or NaN), error}.
  struct Got {
    wire::Status status;
    double value;
    std::string error;
  };
  std::map<uint64_t, Got> results(std::size_t n) {
    std::map<uint64_t, Got> out;
    while (out.size() < n) {
      const auto fv = next();
      REQUIRE(fv.frame->body_type() == wire::Body::Results);
      for (const wire::Result* r : *fv.frame->body_as_Results()->items()) {
        protocol::ClientResult cr;
        protocol::decode_daemon_result(r, &cr);
        double v = std::nan("");
        if (cr.value && cr.value->kind() == wire::ValueKind::Double) v = cr.value->double_value();
        if (cr.value && cr.value->kind() == wire::ValueKind::Int)
          v = static_cast<double>(cr.value->int_value());
        out[cr.id] = {cr.status, v, cr.error};
      }
    }
    return out;
  }
};

// Inputs a = `a` and t = [1, 100] built in `b` (the frame's or a list's own builder).
flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::Input>>> sample(Builder& b,
                                                                                  int64_t a) {
  protocol::WireValueBuilder v(b);
  const auto va = v.integer(a);
  const auto t = v.array(std::vector{v.integer(1), v.integer(100)});
  std::vector<flatbuffers::Offset<wire::Input>> in{wire::CreateInput(b, b.CreateString("a"), va),
                                                   wire::CreateInput(b, b.CreateString("t"), t)};
  return b.CreateVector(in);
}

// An InputList whose one input `x` is made by `make`; its bytes.
std::vector<uint8_t> list_of(const std::function<ValueRef(Builder&)>& make) {
  Builder b;
  const auto v = make(b);
  std::vector<flatbuffers::Offset<wire::Input>> in{wire::CreateInput(b, b.CreateString("x"), v)};
  b.Finish(wire::CreateInputList(b, b.CreateVector(in)));
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

std::vector<uint8_t> sample_list(int64_t a) {
  Builder b;
  b.Finish(wire::CreateInputList(b, sample(b, a)));
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

// Evaluate frames of evaluations (id, handle, encoded inputs).
struct EvaluateFrame {
  Builder f;
  std::vector<flatbuffers::Offset<wire::Evaluation>> items;
  void add(uint64_t id, uint32_t handle, const std::vector<uint8_t>& list) {
    items.push_back(protocol::build_evaluation(f, id, handle, 0, {}, nullptr,
                                               protocol::add_input_list(f, list)));
  }
  std::span<const uint8_t> finish() { return protocol::finish_evaluate(f, items); }
};

const char* kScript = "return inputs.a + inputs.t[2] + (inputs.x or 0)";

}  // namespace

TEST_CASE("outrund: protocol 1 sends plain inputs, protocol 2 encoded ones: the same results") {
  Daemon d({"--single-flight", "off"});
  SUBCASE("versions") {
    Conn v1(d.socket, 1), v2(d.socket, 2);
    CHECK(v1.version == 1);
    CHECK(v2.version == 2);
    CHECK(v1.refused.empty());
    for (uint16_t bad : {uint16_t{0}, uint16_t{4}}) {
      Conn c(d.socket, bad);
      CHECK(c.refused.find("speaks 1 to 3") != std::string::npos);
    }
  }
  SUBCASE("results") {
    Conn v1(d.socket, 1), v2(d.socket, 2);
    const uint32_t h1 = v1.register_script("inputs.sum", kScript);
    const uint32_t h2 = v2.register_script("inputs.sum", kScript);
    Builder f;
    std::vector<flatbuffers::Offset<wire::Evaluation>> plain;
    EvaluateFrame enc;
    for (int64_t i = 0; i < 40; ++i) {
      plain.push_back(
          protocol::build_evaluation(f, static_cast<uint64_t>(i), h1, 0, sample(f, i), nullptr));
      enc.add(static_cast<uint64_t>(i), h2, sample_list(i));
    }
    v1.send(protocol::finish_evaluate(f, plain));
    v2.send(enc.finish());
    const auto a = v1.results(40), b = v2.results(40);
    for (int64_t i = 0; i < 40; ++i) {
      const auto& x = a.at(static_cast<uint64_t>(i));
      const auto& y = b.at(static_cast<uint64_t>(i));
      INFO(i, " ", x.error, " ", y.error);
      CHECK(x.status == wire::Status::Ok);
      CHECK(y.status == wire::Status::Ok);
      CHECK(x.value == static_cast<double>(i + 100));
      CHECK(y.value == x.value);
    }
  }
  CHECK(d.stop() == 0);
}

TEST_CASE(
    "outrund: bad encoded inputs, a buffer that does not verify included, end that "
    "evaluation invalid_argument") {
  Daemon d({"--single-flight", "off"});
  Conn c(d.socket, 2);
  const uint32_t h = c.register_script("inputs.bad", kScript);
  EvaluateFrame ev;
  ev.add(1, h, sample_list(1));
  ev.add(2, h, list_of([](Builder& b) {  // a tag-only kind
           wire::ValueBuilder vb(b);
           vb.add_kind(wire::ValueKind::DateTime);
           vb.add_int_value(1);
           return vb.Finish();
         }));
  ev.add(3, h, list_of([](Builder& b) {  // 2^14 uses of one 1000-byte string: 16 MB counted
           protocol::WireValueBuilder v(b);
           auto x = v.string(std::string(1000, 's'), true);
           for (int i = 0; i < 14; ++i) x = v.array(std::vector{x, x});
           return x;
         }));
  ev.add(4, h, list_of([](Builder& b) {  // 33 levels
           protocol::WireValueBuilder v(b);
           auto x = v.integer(1);
           for (int i = 0; i < 33; ++i) x = v.array(std::vector{x});
           return x;
         }));
  ev.add(5, h, sample_list(5));
  c.send(ev.finish());
  const auto got = c.results(5);
  CHECK(got.at(1).status == wire::Status::Ok);
  CHECK(got.at(1).value == 101);
  CHECK(got.at(5).value == 105);
  CHECK(got.at(2).status == wire::Status::InvalidArgument);
  CHECK(got.at(2).error.find("input 'x' is not a valid value") != std::string::npos);
  CHECK(got.at(3).status == wire::Status::InvalidArgument);
  CHECK(got.at(3).error.find("larger than 8388608") != std::string::npos);
  CHECK(got.at(4).status == wire::Status::InvalidArgument);

  SUBCASE("misaligned") {
    // The nested buffer's bytes placed 4 bytes off an 8-byte boundary (no forced alignment; a
    // pad vector moves it): the frame verifies, the evaluation is refused.
    const auto list = sample_list(9);
    bool tried = false;
    for (std::size_t pad = 1; pad <= 8 && !tried; ++pad) {
      Builder f;
      // Built first, the pad ends up after the nested bytes (a builder fills back to front).
      const auto padding = f.CreateVector(std::vector<uint8_t>(pad, 0));
      (void)padding;
      const auto data = f.CreateVector(list.data(), list.size());
      std::vector<flatbuffers::Offset<wire::Evaluation>> items{
          protocol::build_evaluation(f, 9, h, 0, {}, nullptr, data)};
      const auto frame = protocol::finish_evaluate(f, items);
      // Where the nested bytes sit relative to the frame's start (its length prefix), which the
      // daemon's reader keeps 8-aligned.
      const auto* fr = flatbuffers::GetSizePrefixedRoot<wire::Frame>(frame.data());
      const auto* buf = fr->body_as_Evaluate()->items()->Get(0)->inputs_buffer();
      if ((buf->data() - frame.data()) % 8 == 0) continue;
      tried = true;
      c.send(frame);
      const auto r = c.results(1).at(9);
      CHECK(r.status == wire::Status::InvalidArgument);
      CHECK(r.error.find("8-byte aligned") != std::string::npos);
    }
    CHECK(tried);
  }
  SUBCASE("a nested buffer that does not verify") {
    EvaluateFrame bad;
    bad.add(10, h, std::vector<uint8_t>(64, 0xff));  // its root offset points far outside
    bad.add(11, h, sample_list(11));
    c.send(bad.finish());
    const auto r = c.results(2);
    CHECK(r.at(10).status == wire::Status::InvalidArgument);
    CHECK(r.at(10).error.find("not a valid InputList") != std::string::npos);
    CHECK(r.at(11).value == 111);  // the connection goes on
  }
  CHECK(d.stop() == 0);
}

namespace {

// One Evaluate frame whose `n` items all point at one Evaluation table carrying `list`.
std::span<const uint8_t> shared_evaluation(Builder& f, uint32_t handle, uint64_t id,
                                           const std::vector<uint8_t>& list, std::size_t n) {
  const auto ev =
      protocol::build_evaluation(f, id, handle, 0, {}, nullptr, protocol::add_input_list(f, list));
  return protocol::finish_evaluate(f, std::vector(n, ev));
}

// The results of `n` evaluations that all have id `id`: their statuses and errors.
std::vector<Conn::Got> all_of(Conn& c, uint64_t id, std::size_t n) {
  std::vector<Conn::Got> out;
  while (out.size() < n) {
    const auto fv = c.next();
    REQUIRE(fv.frame->body_type() == wire::Body::Results);
    for (const wire::Result* r : *fv.frame->body_as_Results()->items()) {
      REQUIRE(r->id() == id);
      protocol::ClientResult cr;
      protocol::decode_daemon_result(r, &cr);
      out.push_back({cr.status, 0, cr.error});
    }
  }
  return out;
}

}  // namespace

TEST_CASE("outrund: one nested buffer used by many evaluations of a frame is paid for each time") {
  Daemon d({"--single-flight", "off"});
  Conn c(d.socket, 2);
  const uint32_t h = c.register_script("inputs.shared", "return 1");

  SUBCASE("a walk that would take hours ends at the frame's budget") {
    // 19 levels of an array holding its child twice: 2^20 values in a few hundred bytes. Each
    // use may walk 8 MiB's worth (16 bytes a value) before it is refused; 2,000 uses would be
    // 16 GB of walking without the frame's budget of 16 MiB, which ends it after the second.
    const auto bomb = list_of([](Builder& b) {
      protocol::WireValueBuilder v(b);
      auto x = v.integer(1);
      for (int i = 0; i < 19; ++i) x = v.array(std::vector{x, x});
      return x;
    });
    Builder f;
    c.send(shared_evaluation(f, h, 7, bomb, 2000));
    const auto got = all_of(c, 7, 2000);
    std::size_t frame_spent = 0;
    for (const auto& g : got) {
      CHECK(g.status == wire::Status::InvalidArgument);
      frame_spent += g.error.find("the inputs of this frame") != std::string::npos;
    }
    CHECK(frame_spent >= 1990);
  }
  SUBCASE("bytes past the list are copied for each use, up to the frame's size") {
    // A valid list followed by 3 MiB nobody refers to: five uses fit 16 MiB, the rest do not.
    auto padded = sample_list(1);
    padded.resize(padded.size() + (3u << 20), 0);
    Builder f;
    c.send(shared_evaluation(f, h, 8, padded, 20));
    const auto got = all_of(c, 8, 20);
    std::size_t ok = 0, refused = 0;
    for (const auto& g : got) {
      ok += g.status == wire::Status::Ok;
      refused += g.error.find("inputs_buffers of this frame add up") != std::string::npos;
    }
    CHECK(ok == 5);
    CHECK(refused == 15);
  }
  SUBCASE("fields a value's kind does not use are never read") {
    // An Int whose `items` (not an Int's field) point at a 2^20-value tree: the walk and the
    // worker read the integer only.
    const auto hidden = list_of([](Builder& b) {
      protocol::WireValueBuilder v(b);
      auto x = v.integer(1);
      for (int i = 0; i < 20; ++i) x = v.array(std::vector{x, x});
      const auto items = b.CreateVector(std::vector{x});
      wire::ValueBuilder vb(b);
      vb.add_kind(wire::ValueKind::Int);
      vb.add_int_value(5);
      vb.add_items(items);
      return vb.Finish();
    });
    const uint32_t hx = c.register_script("inputs.hidden", "return inputs.x");
    EvaluateFrame ev;
    for (uint64_t id = 20; id < 220; ++id) ev.add(id, hx, hidden);
    c.send(ev.finish());
    const auto got = c.results(200);
    for (const auto& result : got) {  // no structured binding: INFO captures (clang 14)
      const uint64_t id = result.first;
      const Conn::Got& g = result.second;
      INFO(id, " ", g.error);
      CHECK(g.status == wire::Status::Ok);
      CHECK(g.value == 5);
    }
  }
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund: protocol 1's input names are paid for at each use") {
  // One Input of a 1 MiB name (no value), used 2,000 times by one evaluation: 2 GB of names to
  // copy from a 1 MiB frame. Refused at the frame's decode budget (16 MiB), not copied.
  Daemon d({"--single-flight", "off"});
  Conn c(d.socket, 1);
  const uint32_t h = c.register_script("inputs.names", "return 1");
  Builder f;
  const auto name = f.CreateString(std::string(1u << 20, 'n'));
  const std::vector<flatbuffers::Offset<wire::Input>> uses(2000, wire::CreateInput(f, name));
  const std::vector<flatbuffers::Offset<wire::Evaluation>> items{
      protocol::build_evaluation(f, 9, h, 0, f.CreateVector(uses), nullptr)};
  c.send(protocol::finish_evaluate(f, items));
  const auto got = c.results(1).at(9);
  CHECK(got.status == wire::Status::InvalidArgument);
  CHECK(got.error.find("the inputs of this frame") != std::string::npos);
  CHECK(d.stop() == 0);
}
