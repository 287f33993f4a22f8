// outrun::Client against a daemon that answers with statuses the client does not know (a newer
// outrund, or a broken one): the rule of design/protocol.md "Unknown statuses" on the daemon ->
// client side. A fake daemon in a thread of this process (so SO_PEERCRED names our own uid)
// speaks through the protocol/ encoders.
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "daemon_support.h"
#include "outrun/client.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"

namespace {

using namespace outrun::test;
namespace wire = outrun::wire;
namespace protocol = outrun::protocol;

// Answers the Nth evaluation it is sent with kStatuses[N] (Ok: the value 5), every Control with
// status 200 and every Unregister with NeedSource; registers anything as handle 7.
constexpr std::array<int, 5> kStatuses = {12, 11, 255, 0, 2};

struct FakeDaemon {
  std::string dir, path;
  int listener = -1;
  std::thread thread;
  std::atomic<bool> stop{false};
  // Set: every evaluation is answered Ok with an array of 512 items, each the same 1 MiB string
  // (a frame that verifies and decodes to 512 MiB).
  std::atomic<bool> shared{false};
  std::string error;  // what went wrong in the thread (no doctest macros there)

  FakeDaemon() {
    dir = temp_dir();
    path = dir + "/outrund.sock";
    listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(listen(listener, 4) == 0);
    thread = std::thread([this] { serve(); });
  }
  ~FakeDaemon() {
    finish();
    close(listener);
    std::remove(path.c_str());
    rmdir(dir.c_str());
  }

  void finish() {
    stop = true;
    if (thread.joinable()) thread.join();
  }

  void serve() {
    pollfd p{listener, POLLIN, 0};
    while (!stop && poll(&p, 1, 50) == 0) {
    }
    if (stop) return;
    const int c = accept(listener, nullptr, nullptr);
    if (c < 0) {
      error = "accept failed";
      return;
    }
    protocol::FrameReader reader;
    flatbuffers::FlatBufferBuilder f;
    std::size_t evaluations = 0;
    auto send = [&](std::span<const uint8_t> b) {
      if (::send(c, b.data(), b.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(b.size()))
        error = "send failed";
      f.Clear();
    };
    while (!stop && error.empty()) {
      pollfd q{c, POLLIN, 0};
      if (poll(&q, 1, 50) == 0) continue;
      if (reader.read_from(c) <= 0) break;
      protocol::FrameView fv;
      while (reader.next(fv)) {
        protocol::ClientMessage m;
        std::string why;
        if (!protocol::decode_client_frame(fv.frame, &m, &why)) {
          error = why;
          break;
        }
        if (std::holds_alternative<protocol::ClientHelloMsg>(m)) {
          send(protocol::encode_server_hello(f, "fake", 1, 100));
        } else if (const auto* r = std::get_if<protocol::RegisterMsg>(&m)) {
          send(protocol::encode_registered(f, r->request_id, wire::Status::Ok, {}, 7, 7,
                                           std::array<uint8_t, 32>{}, 0));
        } else if (const auto* ev = std::get_if<protocol::EvaluateMsg>(&m)) {
          if (!ev->items) continue;
          std::vector<flatbuffers::Offset<wire::Result>> items;
          if (shared) {
            const auto big = f.CreateString(std::string(1u << 20, 'x'));
            const std::vector<flatbuffers::Offset<wire::Value>> strings(
                512, wire::CreateValue(f, wire::ValueKind::String, false, 0, 0.0, big));
            const auto array = wire::CreateValue(f, wire::ValueKind::Array, false, 0, 0.0, 0, 0,
                                                 f.CreateVector(strings));
            for (const wire::Evaluation* e : *ev->items)
              items.push_back(protocol::build_result(f, e->id(), wire::Status::Ok, array, ""));
            send(protocol::finish_results(f, items));
            continue;
          }
          for (const wire::Evaluation* e : *ev->items) {
            const auto s = static_cast<wire::Status>(kStatuses[evaluations++ % kStatuses.size()]);
            const bool ok = s == wire::Status::Ok;
            items.push_back(
                protocol::build_result(f, e->id(), s,
                                       ok ? wire::CreateValue(f, wire::ValueKind::Int, false, 5)
                                          : flatbuffers::Offset<wire::Value>(),
                                       ok ? "" : "the daemon's message"));
          }
          send(protocol::finish_results(f, items));
        } else if (const auto* ctl = std::get_if<protocol::ControlMsg>(&m)) {
          send(protocol::encode_control_reply(f, ctl->request_id, static_cast<wire::Status>(200),
                                              "from the future", "{}"));
        } else if (const auto* u = std::get_if<protocol::UnregisterMsg>(&m)) {
          send(protocol::encode_unregistered(f, u->request_id, wire::Status::NeedSource, "?"));
        }
      }
    }
    close(c);
  }
};

// A client of `d` with the script "k" registered (the fake's handle 7).
void connect_and_register(const FakeDaemon& d, std::unique_ptr<outrun::Client>* c,
                          outrun::Script* s) {
  outrun::ClientOptions o;
  o.socket = d.path;
  o.reply_timeout = std::chrono::milliseconds(5000);
  REQUIRE(!outrun::Client::connect(o, c));
  REQUIRE(!(*c)->register_script("k", "return 5", s));
}

}  // namespace

TEST_CASE(
    "outrun::Client: a status it does not know ends that answer runtime_error (a request: "
    "protocol_error), nothing else") {
  FakeDaemon d;
  std::unique_ptr<outrun::Client> c;
  outrun::Script s;
  connect_and_register(d, &c, &s);
  // One after the other, so the fake answers them in kStatuses' order.
  for (std::size_t i = 0; i < 2 * kStatuses.size(); ++i) {
    CAPTURE(i);
    const int st = kStatuses[i % kStatuses.size()];
    const outrun::Result r = c->evaluate(s, {}).get();
    if (st == 0) {
      CHECK(r.status == outrun::Status::ok);
      CHECK(r.value == outrun::Value(int64_t{5}));
    } else if (st == 2) {
      CHECK(r.status == outrun::Status::runtime_error);
      CHECK(r.error == "the daemon's message");
    } else {  // 12, 255: from a newer daemon; 11 (NeedSource): never a daemon's
      CHECK(r.status == outrun::Status::runtime_error);
      CHECK(r.error == "outrund sent an unknown status " + std::to_string(st));
    }
    CHECK(c->connected());  // the connection goes on
  }
  std::string json;
  const outrun::Error e = c->stats_json(&json);
  CHECK(e.code == outrun::ErrorCode::protocol_error);
  CHECK(e.message == "outrund sent an unknown status 200");
  const outrun::Error u = c->unregister_script("k");
  CHECK(u.code == outrun::ErrorCode::protocol_error);
  CHECK(u.message == "outrund sent an unknown status 11");
  CHECK(c->connected());
  c.reset();
  d.finish();
  CHECK(d.error.empty());
}

TEST_CASE(
    "outrun::Client: results that share a large string end runtime_error past the decode "
    "budget and the connection goes on") {
  FakeDaemon d;
  std::unique_ptr<outrun::Client> c;
  outrun::Script s;
  connect_and_register(d, &c, &s);
  d.shared = true;
  const outrun::Result r = c->evaluate(s, {}).get();
  CHECK(r.status == outrun::Status::runtime_error);
  CHECK(r.error.find("past the decode budget") != std::string::npos);
  CHECK(c->connected());
  d.shared = false;
  const outrun::Result next = c->evaluate(s, {}).get();  // the fake's first status: 12
  CHECK(next.status == outrun::Status::runtime_error);
  CHECK(next.error == "outrund sent an unknown status 12");
  c.reset();
  d.finish();
  CHECK(d.error.empty());
}
