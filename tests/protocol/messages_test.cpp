// The codecs of protocol/ (messages.h, client_messages.h, worker_exit.h): every encoder's frame
// verifies and its decoder gives back what went in; each direction's decoder refuses the bodies
// of the other directions; the two rules for a status (worker -> host: a violation; daemon ->
// client: runtime_error, the connection goes on) for every one of the 256 values; the exit codes'
// words.
#include "outrun/protocol/messages.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/worker_exit.h"

namespace outrun::protocol {
namespace {

// A frame as a receiver holds it: copied to 8-aligned storage and verified.
struct Received {
  std::vector<uint64_t> storage;
  const wire::Frame* frame = nullptr;
  explicit Received(std::span<const uint8_t> bytes) : storage((bytes.size() + 7) / 8) {
    std::memcpy(storage.data(), bytes.data(), bytes.size());
    frame = verify_frame(reinterpret_cast<const uint8_t*>(storage.data()), bytes.size());
    REQUIRE(frame != nullptr);
  }
};

// One frame of each body, the way its sender builds it.
std::vector<std::vector<uint8_t>> one_of_each() {
  std::vector<std::vector<uint8_t>> out;
  auto keep = [&](std::span<const uint8_t> f) { out.emplace_back(f.begin(), f.end()); };
  flatbuffers::FlatBufferBuilder f;
  const std::vector<std::string> ids = {"a"};
  keep(encode_hello(f, 1));
  f.Clear();
  auto ev = build_evaluation(f, 1, 2, 0, {}, nullptr);
  keep(finish_evaluate(f, {&ev, 1}));
  f.Clear();
  auto r = build_result(f, 1, wire::Status::Ok, {}, {});
  keep(finish_results(f, {&r, 1}));
  f.Clear();
  keep(encode_shutdown(f));
  f.Clear();
  keep(encode_client_hello(f, "c"));
  f.Clear();
  keep(encode_server_hello(f, "1.0", 2, 3));
  f.Clear();
  keep(encode_register(f, 1, "k", "return 1"));
  f.Clear();
  keep(encode_registered(f, 1, wire::Status::Ok, {}, 7, 7, std::array<uint8_t, 32>{}, 0));
  f.Clear();
  keep(encode_control(f, 1, wire::ControlCommand::Stats, 0));
  f.Clear();
  keep(encode_control_reply(f, 1, wire::Status::Ok, {}, "{}"));
  f.Clear();
  const uint32_t sid = 3;
  keep(encode_forget(f, {&sid, 1}));
  f.Clear();
  keep(encode_unregister(f, 1, "k"));
  f.Clear();
  keep(encode_unregistered(f, 1, wire::Status::Ok, {}));
  f.Clear();
  keep(encode_define_tags(f, 1, "x", false));
  f.Clear();
  keep(encode_remove_tags(f, 1, ids));
  f.Clear();
  keep(encode_list_tags(f, 1));
  f.Clear();
  keep(encode_source_updates(f, 1, 0, {}));
  f.Clear();
  keep(encode_subscribe(f, 1, ids, false));
  f.Clear();
  keep(encode_tag_changes(f, {}));
  f.Clear();
  keep(encode_read_tags(f, 1, ids));
  f.Clear();
  keep(encode_tag_values(f, 1, wire::Status::Ok, {}, {}));
  f.Clear();
  keep(encode_tags_reply(f, 1, wire::Status::Ok, {}, {}));
  f.Clear();
  const CompileRequest req{4, "return 1", "k"};
  keep(encode_compile(f, {&req, 1}));
  f.Clear();
  auto c = build_compiled(f, 4, wire::Status::Ok, "\x1bLuaT", {});
  keep(finish_compiled(f, {&c, 1}));
  return out;
}

}  // namespace

TEST_CASE("protocol codecs: one encoder per body, in the union's order, each verifying") {
  const auto frames = one_of_each();
  REQUIRE(frames.size() == static_cast<std::size_t>(wire::Body::MAX));
  for (std::size_t i = 0; i < frames.size(); ++i) {
    Received r(frames[i]);
    CHECK(static_cast<std::size_t>(r.frame->body_type()) == i + 1);
  }
}

TEST_CASE("protocol codecs: each direction's decoder takes its bodies and refuses the others") {
  using B = wire::Body;
  const std::vector<B> host = {B::Evaluate, B::Shutdown, B::Forget};
  const std::vector<B> worker = {B::Hello, B::Results};
  const std::vector<B> client = {B::ClientHello,   B::Register,   B::Evaluate,   B::Unregister,
                                 B::Control,       B::DefineTags, B::RemoveTags, B::ListTags,
                                 B::SourceUpdates, B::Subscribe,  B::ReadTags};
  const std::vector<B> daemon = {B::ServerHello,  B::Registered, B::Results,   B::ControlReply,
                                 B::Unregistered, B::TagChanges, B::TagValues, B::TagsReply};
  auto in = [](const std::vector<B>& v, B b) {
    return std::find(v.begin(), v.end(), b) != v.end();
  };
  for (const auto& bytes : one_of_each()) {
    Received r(bytes);
    const B type = r.frame->body_type();
    CAPTURE(wire::EnumNameBody(type));
    std::string why;
    HostMessage hm;
    CHECK(decode_host_frame(r.frame, &hm, &why) == in(host, type));
    WorkerMessage wm;
    CHECK(decode_worker_frame(r.frame, &wm, &why) == in(worker, type));
    ClientMessage cm;
    why.clear();
    const bool from_client = decode_client_frame(r.frame, &cm, &why);
    CHECK(from_client == in(client, type));
    if (!from_client) CHECK(why.find("a client does not send") != std::string::npos);
    DaemonMessage dm;
    CHECK(decode_daemon_frame(r.frame, &dm, &why) == in(daemon, type));
  }
}

TEST_CASE("protocol codecs: the worker pipe's messages decode to what was encoded") {
  flatbuffers::FlatBufferBuilder f;
  SUBCASE("Hello, and a Hello of another version is a violation") {
    Received r(encode_hello(f, 4242));
    WorkerMessage m;
    std::string why;
    REQUIRE(decode_worker_frame(r.frame, &m, &why));
    CHECK(std::get<HelloMsg>(m).pid == 4242);
    CHECK(std::get<HelloMsg>(m).protocol_version == kProtocolVersion);
    f.Clear();
    Received old(encode_hello(f, 1, 7));
    CHECK(!decode_worker_frame(old.frame, &m, &why));
    CHECK(why == "speaks protocol version 7, host speaks " + std::to_string(kProtocolVersion));
  }
  SUBCASE("Evaluate, with and without source") {
    const std::array<uint8_t, 32> sha = {1, 2, 3};
    const ScriptSource src{sha, "return 1", "Line1.Avg", {}};
    auto in = f.CreateVector(std::vector<flatbuffers::Offset<wire::Input>>{
        wire::CreateInput(f, f.CreateString("x"), wire::CreateValue(f))});
    const flatbuffers::Offset<wire::Evaluation> items[] = {
        build_evaluation(f, 11, 3, 1000, in, &src), build_evaluation(f, 12, 3, 0, {}, nullptr)};
    Received r(finish_evaluate(f, items));
    HostMessage m;
    std::string why;
    REQUIRE(decode_host_frame(r.frame, &m, &why));
    const auto* evs = std::get<EvaluateMsg>(m).items;
    REQUIRE(evs);
    REQUIRE(evs->size() == 2);
    const wire::Evaluation* a = evs->Get(0);
    CHECK(a->id() == 11);
    CHECK(a->script_id() == 3);
    CHECK(a->timeout_us() == 1000);
    REQUIRE(a->inputs());
    CHECK(a->inputs()->Get(0)->name()->str() == "x");
    ScriptSource got;
    REQUIRE(evaluation_source(a, &got));
    CHECK(std::equal(got.sha256.begin(), got.sha256.end(), sha.begin(), sha.end()));
    CHECK(got.source == "return 1");
    REQUIRE(got.chunk_name);
    CHECK(*got.chunk_name == "Line1.Avg");
    const wire::Evaluation* b = evs->Get(1);
    CHECK(b->id() == 12);
    CHECK(b->timeout_us() == 0);
    CHECK(!b->inputs());
    CHECK(!evaluation_source(b, &got));
  }
  SUBCASE("a source without a 32-byte SHA-256 is no source") {
    const std::array<uint8_t, 31> short_sha{};
    const ScriptSource src{short_sha, "return 1", std::nullopt, {}};
    auto e = build_evaluation(f, 1, 1, 0, {}, &src);
    Received r(finish_evaluate(f, {&e, 1}));
    ScriptSource got;
    CHECK(!evaluation_source(r.frame->body_as_Evaluate()->items()->Get(0), &got));
  }
  SUBCASE("Results") {
    auto v = wire::CreateValue(f, wire::ValueKind::Int, false, 5);
    const flatbuffers::Offset<wire::Result> items[] = {
        build_result(f, 1, wire::Status::Ok, v, {}),
        build_result(f, 2, wire::Status::RuntimeError, {}, "k:1: boom"),
        build_result(f, 3, wire::Status::NeedSource, {}, {})};
    Received r(finish_results(f, items));
    WorkerMessage m;
    std::string why;
    REQUIRE(decode_worker_frame(r.frame, &m, &why));
    const auto* rs = std::get<ResultsMsg>(m).items;
    REQUIRE(rs);
    REQUIRE(rs->size() == 3);
    ResultView a, b, c;
    REQUIRE(decode_worker_result(rs->Get(0), &a, &why));
    CHECK(a.id == 1);
    CHECK(a.status == wire::Status::Ok);
    REQUIRE(a.value);
    CHECK(a.value->int_value() == 5);
    REQUIRE(decode_worker_result(rs->Get(1), &b, &why));
    CHECK(b.status == wire::Status::RuntimeError);
    CHECK(b.error == "k:1: boom");
    CHECK(!b.value);
    REQUIRE(decode_worker_result(rs->Get(2), &c, &why));
    CHECK(c.status == wire::Status::NeedSource);
    CHECK(!rs->Get(2)->error());  // an empty error is not written
  }
  SUBCASE("Shutdown and Forget") {
    Received s(encode_shutdown(f));
    HostMessage m;
    std::string why;
    REQUIRE(decode_host_frame(s.frame, &m, &why));
    CHECK(std::holds_alternative<ShutdownMsg>(m));
    f.Clear();
    const std::vector<uint32_t> ids = {1, 5, 4194303};
    Received fg(encode_forget(f, ids));
    REQUIRE(decode_host_frame(fg.frame, &m, &why));
    const auto* got = std::get<ForgetMsg>(m).script_ids;
    REQUIRE(got);
    CHECK(std::vector<uint32_t>(got->begin(), got->end()) == ids);
  }
  SUBCASE("a frame a worker does not send") {
    Received s(encode_shutdown(f));
    WorkerMessage m;
    std::string why;
    CHECK(!decode_worker_frame(s.frame, &m, &why));
    CHECK(why == "sent an unexpected frame type");
  }
}

TEST_CASE("protocol codecs: a status a worker may not send is a violation, whichever it is") {
  // Host and worker are built together: a host-only or unknown status is a broken worker.
  for (int v = 0; v < 256; ++v) {
    CAPTURE(v);
    const auto s = static_cast<wire::Status>(v);
    std::string why;
    const bool ok = check_worker_status(s, &why);
    switch (v) {
      case 0:
      case 1:
      case 2:
      case 3:
      case 5:
      case 10:
      case 11:  // Ok .. NeedSource, a worker's
        CHECK(ok);
        CHECK(why.empty());
        break;
      case 4:
      case 6:
      case 7:
      case 8:
      case 9:  // Killed, Busy, WorkerLost, Unavailable, Cancelled
        CHECK(!ok);
        CHECK(why == "sent a status only the host may give (" + std::to_string(v) + ")");
        break;
      default:
        CHECK(!ok);
        CHECK(why == "sent an unknown status (" + std::to_string(v) + ")");
    }
    // The same through a Result.
    flatbuffers::FlatBufferBuilder f;
    auto r = build_result(f, 9, s, {}, "message");
    Received rec(finish_results(f, {&r, 1}));
    ResultView view;
    std::string why2;
    CHECK(decode_worker_result(rec.frame->body_as_Results()->items()->Get(0), &view, &why2) == ok);
    CHECK(why2 == why);
  }
}

TEST_CASE("protocol codecs: a status a client does not know ends its answer runtime_error") {
  // Client and daemon ship separately: a newer daemon's status (or NeedSource, which no daemon
  // sends) fails that one answer, with the number, and nothing else.
  for (int v = 0; v < 256; ++v) {
    CAPTURE(v);
    const auto s = static_cast<wire::Status>(v);
    const bool known = v <= static_cast<int>(wire::Status::InvalidArgument);
    const std::string unknown = "outrund sent an unknown status " + std::to_string(v);
    std::string error = "the daemon's words";
    CHECK(client_status(s, &error) == (known ? s : wire::Status::RuntimeError));
    CHECK(error == (known ? "the daemon's words" : unknown));

    flatbuffers::FlatBufferBuilder f;
    auto item = build_result(f, 4, s, wire::CreateValue(f, wire::ValueKind::Int, false, 1), "e");
    Received res(finish_results(f, {&item, 1}));
    ClientResult cr;
    decode_daemon_result(res.frame->body_as_Results()->items()->Get(0), &cr);
    CHECK(cr.id == 4);
    CHECK(cr.status == (known ? s : wire::Status::RuntimeError));
    if (v == 0) {
      REQUIRE(cr.value);
      CHECK(cr.error.empty());
    } else {
      CHECK(!cr.value);
      CHECK(cr.error == (known ? "e" : unknown));
    }

    // And every reply: Registered, Unregistered, ControlReply, TagsReply, TagValues.
    std::vector<std::vector<uint8_t>> replies;
    auto keep = [&](std::span<const uint8_t> b) { replies.emplace_back(b.begin(), b.end()); };
    f.Clear();
    keep(encode_registered(f, 5, s, "e", 1, 1, std::array<uint8_t, 32>{}, 0));
    f.Clear();
    keep(encode_unregistered(f, 5, s, "e"));
    f.Clear();
    keep(encode_control_reply(f, 5, s, "e", "{}"));
    f.Clear();
    keep(encode_tags_reply(f, 5, s, "e", "{}"));
    f.Clear();
    keep(encode_tag_values(f, 5, s, "e", {}));
    for (const auto& bytes : replies) {
      Received rep(bytes);
      CAPTURE(wire::EnumNameBody(rep.frame->body_type()));
      DaemonMessage m;
      std::string why;
      REQUIRE(decode_daemon_frame(rep.frame, &m, &why));
      wire::Status st{};
      std::string err;
      uint64_t rid = 0;
      auto take = [&](const auto& reply) {
        st = reply.status;
        err = reply.error;
        rid = reply.request_id;
      };
      if (auto* a = std::get_if<RegisteredMsg>(&m)) {
        take(*a);
      } else if (auto* b = std::get_if<ReplyMsg>(&m)) {
        take(*b);
      } else if (auto* c = std::get_if<TagValuesMsg>(&m)) {
        take(*c);
      } else {
        FAIL("not a reply");
      }
      CHECK(rid == 5);
      CHECK(st == (known ? s : wire::Status::RuntimeError));
      if (v != 0) CHECK(err == (known ? "e" : unknown));
    }
  }
}

TEST_CASE("protocol codecs: the client socket's messages decode to what was encoded") {
  flatbuffers::FlatBufferBuilder f;
  std::string why;
  ClientMessage cm;
  DaemonMessage dm;
  SUBCASE("ClientHello, ServerHello") {
    Received h(encode_client_hello(f, "me", 3));
    REQUIRE(decode_client_frame(h.frame, &cm, &why));
    CHECK(std::get<ClientHelloMsg>(cm).client_name == "me");
    CHECK(std::get<ClientHelloMsg>(cm).protocol_version == 3);
    f.Clear();
    Received s(encode_server_hello(f, "1.2.3", 4, 100));
    REQUIRE(decode_daemon_frame(s.frame, &dm, &why));
    const auto& sh = std::get<ServerHelloMsg>(dm);
    CHECK(sh.protocol_version == kProtocolVersion);
    CHECK(sh.shards == 4);
    CHECK(sh.server_version == "1.2.3");
    CHECK(!sh.error);
    CHECK(sh.max_inflight == 100);
    f.Clear();
    Received refused(encode_server_hello(f, "1.2.3", 0, 0, "too many clients"));
    REQUIRE(decode_daemon_frame(refused.frame, &dm, &why));
    REQUIRE(std::get<ServerHelloMsg>(dm).error);
    CHECK(*std::get<ServerHelloMsg>(dm).error == "too many clients");
  }
  SUBCASE("Register, Registered") {
    Received r(encode_register(f, 9, "k", "return 1"));
    REQUIRE(decode_client_frame(r.frame, &cm, &why));
    const auto& reg = std::get<RegisterMsg>(cm);
    CHECK(reg.request_id == 9);
    REQUIRE(reg.key);
    CHECK(*reg.key == "k");
    REQUIRE(reg.source);
    CHECK(*reg.source == "return 1");
    f.Clear();
    // A Register without fields (hostile): absent, not empty.
    Received bare(finish_frame(f, wire::Body::Register, wire::CreateRegister(f, 1).Union()));
    REQUIRE(decode_client_frame(bare.frame, &cm, &why));
    CHECK(!std::get<RegisterMsg>(cm).key);
    CHECK(!std::get<RegisterMsg>(cm).source);
    f.Clear();
    std::array<uint8_t, 32> sha{};
    sha[31] = 9;
    Received ok(encode_registered(f, 9, wire::Status::Ok, {}, uint64_t{1} << 40 | 77, 77, sha, 2));
    REQUIRE(decode_daemon_frame(ok.frame, &dm, &why));
    const auto& got = std::get<RegisteredMsg>(dm);
    CHECK(got.request_id == 9);
    CHECK(got.status == wire::Status::Ok);
    CHECK(got.handle == 77);
    CHECK(got.handle64 == (uint64_t{1} << 40 | 77));
    CHECK(got.shard == 2);
    REQUIRE(got.sha256);
    CHECK(*got.sha256 == sha);
    f.Clear();
    Received err(encode_registered(f, 10, wire::Status::Unavailable, "full", 77, 77, sha, 2));
    REQUIRE(decode_daemon_frame(err.frame, &dm, &why));
    const auto& bad = std::get<RegisteredMsg>(dm);
    CHECK(bad.status == wire::Status::Unavailable);
    CHECK(bad.error == "full");
    CHECK(bad.handle == 0);  // nothing else is written
    CHECK(bad.handle64 == 0);
    CHECK(!bad.sha256);
  }
  SUBCASE("Unregister, Control, ControlReply, Unregistered") {
    Received u(encode_unregister(f, 3, "k"));
    REQUIRE(decode_client_frame(u.frame, &cm, &why));
    REQUIRE(std::get<UnregisterMsg>(cm).key);
    CHECK(*std::get<UnregisterMsg>(cm).key == "k");
    f.Clear();
    Received c(encode_control(f, 4, wire::ControlCommand::ListScripts, 2, "6b:1", 50));
    REQUIRE(decode_client_frame(c.frame, &cm, &why));
    const auto& ctl = std::get<ControlMsg>(cm);
    CHECK(ctl.request_id == 4);
    CHECK(ctl.command == wire::ControlCommand::ListScripts);
    CHECK(ctl.shard == 2);
    CHECK(ctl.after == "6b:1");
    CHECK(ctl.limit == 50);
    f.Clear();
    Received first(encode_control(f, 5, wire::ControlCommand::ListScripts, 0));
    CHECK(!first.frame->body_as_Control()->after());  // no cursor: not written
    f.Clear();
    Received cr(encode_control_reply(f, 4, wire::Status::Ok, {}, "{\"a\":1}"));
    REQUIRE(decode_daemon_frame(cr.frame, &dm, &why));
    CHECK(std::get<ReplyMsg>(dm).type == wire::Body::ControlReply);
    CHECK(std::get<ReplyMsg>(dm).json == "{\"a\":1}");
    CHECK(std::get<ReplyMsg>(dm).error.empty());
    f.Clear();
    Received ur(encode_unregistered(f, 3, wire::Status::InvalidArgument, "no such key"));
    REQUIRE(decode_daemon_frame(ur.frame, &dm, &why));
    CHECK(std::get<ReplyMsg>(dm).type == wire::Body::Unregistered);
    CHECK(std::get<ReplyMsg>(dm).status == wire::Status::InvalidArgument);
    CHECK(std::get<ReplyMsg>(dm).error == "no such key");
  }
  SUBCASE("the tags frames") {
    const std::vector<std::string> ids = {"a", "b"};
    auto ids_of = [](const StringVector* v) {
      std::vector<std::string> out;
      if (v)
        for (const auto* s : *v) out.push_back(s->str());
      return out;
    };
    Received d(encode_define_tags(f, 1, "[tags]", true));
    REQUIRE(decode_client_frame(d.frame, &cm, &why));
    REQUIRE(std::get<DefineTagsMsg>(cm).toml);
    CHECK(*std::get<DefineTagsMsg>(cm).toml == "[tags]");
    CHECK(std::get<DefineTagsMsg>(cm).replace_all);
    f.Clear();
    Received rm(encode_remove_tags(f, 2, ids));
    REQUIRE(decode_client_frame(rm.frame, &cm, &why));
    CHECK(ids_of(std::get<RemoveTagsMsg>(cm).ids) == ids);
    f.Clear();
    Received l(encode_list_tags(f, 3));
    REQUIRE(decode_client_frame(l.frame, &cm, &why));
    CHECK(std::get<ListTagsMsg>(cm).request_id == 3);
    f.Clear();
    auto tv = wire::CreateTagValue(f, f.CreateString("t1"));
    Received su(encode_source_updates(f, 4, 123, {&tv, 1}));
    REQUIRE(decode_client_frame(su.frame, &cm, &why));
    CHECK(std::get<SourceUpdatesMsg>(cm).time == 123);
    REQUIRE(std::get<SourceUpdatesMsg>(cm).updates);
    CHECK(std::get<SourceUpdatesMsg>(cm).updates->Get(0)->tag()->str() == "t1");
    f.Clear();
    Received sb(encode_subscribe(f, 5, ids, true));
    REQUIRE(decode_client_frame(sb.frame, &cm, &why));
    CHECK(ids_of(std::get<SubscribeMsg>(cm).ids) == ids);
    CHECK(std::get<SubscribeMsg>(cm).cancel);
    f.Clear();
    Received rt(encode_read_tags(f, 6, ids));
    REQUIRE(decode_client_frame(rt.frame, &cm, &why));
    CHECK(ids_of(std::get<ReadTagsMsg>(cm).ids) == ids);
    f.Clear();
    auto tv2 = wire::CreateTagValue(f, f.CreateString("t2"));
    Received tc(encode_tag_changes(f, {&tv2, 1}));
    REQUIRE(decode_daemon_frame(tc.frame, &dm, &why));
    REQUIRE(std::get<TagChangesMsg>(dm).changes);
    CHECK(std::get<TagChangesMsg>(dm).changes->Get(0)->tag()->str() == "t2");
    f.Clear();
    auto tv3 = wire::CreateTagValue(f, f.CreateString("t3"));
    Received vals(encode_tag_values(f, 6, wire::Status::Ok, "ignored", {&tv3, 1}));
    REQUIRE(decode_daemon_frame(vals.frame, &dm, &why));
    REQUIRE(std::get<TagValuesMsg>(dm).values);
    CHECK(std::get<TagValuesMsg>(dm).values->Get(0)->tag()->str() == "t3");
    CHECK(std::get<TagValuesMsg>(dm).error.empty());
    f.Clear();
    Received none(encode_tag_values(f, 6, wire::Status::Unavailable, "too big", {&tv3, 1}));
    REQUIRE(decode_daemon_frame(none.frame, &dm, &why));
    CHECK(!std::get<TagValuesMsg>(dm).values);
    CHECK(std::get<TagValuesMsg>(dm).error == "too big");
    f.Clear();
    Received tr(encode_tags_reply(f, 7, wire::Status::Ok, {}, "{\"defined\":[]}"));
    REQUIRE(decode_daemon_frame(tr.frame, &dm, &why));
    CHECK(std::get<ReplyMsg>(dm).type == wire::Body::TagsReply);
    CHECK(std::get<ReplyMsg>(dm).json == "{\"defined\":[]}");
  }
}

TEST_CASE("protocol codecs: the worker's exit codes and how the host words them") {
  CHECK(exit_code(WorkerExit::kOk) == 0);
  CHECK(exit_code(WorkerExit::kUsage) == 64);
  CHECK(exit_code(WorkerExit::kTestFault) == 70);
  CHECK(exit_code(WorkerExit::kIo) == 74);
  CHECK(exit_code(WorkerExit::kProtocol) == 76);
  CHECK(exit_code(WorkerExit::kOrphan) == 77);
  CHECK(exit_code(WorkerExit::kStatusPage) == 78);
  CHECK(exit_code(WorkerExit::kConfine) == 79);
  CHECK(describe_worker_exit(0) == "exited");
  CHECK(describe_worker_exit(74) == "exited: its pipe to the host failed (code 74)");
  CHECK(describe_worker_exit(76) == "exited: the host sent a frame it could not verify (code 76)");
  CHECK(describe_worker_exit(77) == "exited: the host was gone at start (code 77)");
  CHECK(describe_worker_exit(78) == "exited: it could not map its status page (code 78)");
  CHECK(describe_worker_exit(79) ==
        "exited: it could not confine itself (rlimits, no_new_privs, seccomp) (code 79)");
  CHECK(describe_worker_exit(64) == "exited with code 64");
  CHECK(describe_worker_exit(70) == "exited with code 70");
  CHECK(describe_worker_exit(1) == "exited with code 1");
  CHECK(!script_may_cause_exit(0));
  CHECK(!script_may_cause_exit(74));
  CHECK(!script_may_cause_exit(76));
  CHECK(script_may_cause_exit(1));
  CHECK(script_may_cause_exit(79));
}

}  // namespace outrun::protocol
