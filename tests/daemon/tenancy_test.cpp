// Tenancy and identity in outrund (design/daemon.md "Who owns a key", design/protocol.md
// "Handles"): the tags engine's scripts are out of clients' reach, a key is replaced or
// unregistered only by the uid that registered it (or an admin), a stale handle never names
// another record however often its id is reused, and a replaced record is charged to nobody.
#include <doctest/doctest.h>
#include <flatbuffers/flatbuffers.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon_support.h"
#include "outrun/client.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/outrun_generated.h"
#include "outrun/tags.h"

namespace {

using namespace std::chrono_literals;
using namespace outrun::test;
namespace wire = outrun::wire;
namespace tags = outrun::tags;

constexpr uid_t kNobody = 65534;

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/outrund-tenancy-XXXXXX";
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
    std::ofstream(path) << text;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

// A client speaking raw frames (any protocol version), one request at a time.
struct Raw {
  int fd = -1;
  outrun::protocol::FrameReader reader;
  uint64_t rid = 1;

  explicit Raw(const std::string& path, uint16_t version = outrun::protocol::kProtocolVersion) {
    fd = connect_raw(path);
    flatbuffers::FlatBufferBuilder f;
    send(outrun::protocol::encode_client_hello(f, "tenancy", version));
    const wire::Frame* h = next();
    REQUIRE(h->body_type() == wire::Body::ServerHello);
    REQUIRE(h->body_as_ServerHello()->error() == nullptr);
  }
  ~Raw() {
    if (fd >= 0) close(fd);
  }
  void send(std::span<const uint8_t> b) {
    const uint8_t* p = b.data();
    std::size_t n = b.size();
    while (n > 0) {
      const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
      REQUIRE(k > 0);
      p += k;
      n -= static_cast<std::size_t>(k);
    }
  }
  const wire::Frame* next() {
    outrun::protocol::FrameView fv;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!reader.next(fv)) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, 100);
      if (p.revents & POLLIN) REQUIRE(reader.read_from(fd) > 0);
    }
    return fv.frame;
  }
  struct Reg {
    wire::Status status = wire::Status::Ok;
    std::string error;
    uint64_t handle64 = 0;
    uint32_t handle = 0;
  };
  Reg reg(const std::string& key, const std::string& source) {
    flatbuffers::FlatBufferBuilder f;
    send(outrun::protocol::encode_register(f, rid++, key, source));
    const wire::Frame* fr = next();
    REQUIRE(fr->body_type() == wire::Body::Registered);
    const auto* r = fr->body_as_Registered();
    return {r->status(), r->error() ? r->error()->str() : "", r->handle64(), r->handle()};
  }
  std::pair<wire::Status, std::string> unreg(const std::string& key) {
    flatbuffers::FlatBufferBuilder f;
    send(outrun::protocol::encode_unregister(f, rid++, key));
    const wire::Frame* fr = next();
    REQUIRE(fr->body_type() == wire::Body::Unregistered);
    const auto* u = fr->body_as_Unregistered();
    return {u->status(), u->error() ? u->error()->str() : ""};
  }
  struct Res {
    wire::Status status = wire::Status::Ok;
    std::string error;
    int64_t value = 0;
  };
  // One evaluation of `handle64` (protocol 3; its low 32 bits as script_id, as outrun::Client
  // sends it) or, when it is 0, of the 32-bit `script_id`.
  Res eval(uint64_t handle64, uint32_t script_id = 0) {
    flatbuffers::FlatBufferBuilder f;
    const auto ev = outrun::protocol::build_evaluation(
        f, rid++, handle64 ? static_cast<uint32_t>(handle64) : script_id, 0, {}, nullptr, {},
        handle64);
    send(outrun::protocol::finish_evaluate(f, std::span(&ev, 1)));
    const wire::Frame* fr = next();
    REQUIRE(fr->body_type() == wire::Body::Results);
    const auto* r = fr->body_as_Results()->items()->Get(0);
    Res out{r->status(), r->error() ? r->error()->str() : "", 0};
    if (r->value()) out.value = r->value()->int_value();
    return out;
  }
};

tags::SourceUpdate good(const std::string& tag, outrun::Value v) {
  tags::SourceUpdate u;
  u.tag = tag;
  u.value.value = std::move(v);
  u.value.status = tags::codes::Good;
  return u;
}

nlohmann::json quota_of(const Daemon& d, const char* uid) {
  const auto q = d.stats()["registry"]["quota"]["uids"];
  return q.contains(uid) ? q[uid] : nlohmann::json{{"scripts", 0}, {"bytes", 0}};
}

}  // namespace

TEST_CASE("outrund tenancy: a non-admin cannot name, unregister or block a tag's script") {
  TempFile tags_file(R"(
[[tag]]
id = "T1"
type = "Float"
inputs = ["a"]
script = "return inputs.a * 2"
)");
  TempFile conf("[daemon]\nadmin_uids = [4242]\ntags_file = \"" + tags_file.path + "\"\n");
  Daemon d({"--config", conf.path});  // this test's uid may evaluate but is no admin
  auto c = d.client();
  auto t1_after = [&](double a) {
    REQUIRE(!c->update_sources({good("a", outrun::Value(a))}));
    tags::DataValue v;
    for (int i = 0; i < 500; ++i) {
      std::vector<tags::Change> got;
      REQUIRE(!c->read_tags({"T1"}, &got));
      v = got.at(0).value;
      if (v.status == tags::codes::Good && v.value.is<float>() &&
          v.value.as<float>() == static_cast<float>(2 * a))
        break;
      std::this_thread::sleep_for(10ms);
    }
    return v;
  };
  auto good_value = [](const tags::DataValue& v, float want) {
    INFO("status " << std::hex << v.status);
    CHECK(v.status == tags::codes::Good);
    CHECK((v.value.is<float>() && v.value.as<float>() == want));
  };
  good_value(t1_after(10), 20.0f);

  // The key the tag's script had before: not the tag's any more (no such key here).
  outrun::Error e = c->unregister_script("tag:T1");
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  good_value(t1_after(11), 22.0f);
  // The tags namespace itself is refused, for Register and Unregister alike.
  {
    Raw raw(d.socket);
    const std::string internal = std::string(1, '\0') + "tag:T1";
    auto [st, why] = raw.unreg(internal);
    CHECK(st == wire::Status::InvalidArgument);
    CHECK(why.find("reserved") != std::string::npos);
    const Raw::Reg r = raw.reg(internal, "return 666");
    CHECK(r.status == wire::Status::InvalidArgument);
    CHECK(r.error.find("reserved") != std::string::npos);
  }
  good_value(t1_after(12), 24.0f);
  // A client's "tag:T1" is a key of its own: registering, running and unregistering it leaves
  // the tag alone (nor do they share single flight).
  outrun::Script s;
  REQUIRE(!c->register_script("tag:T1", "return 666", &s));
  CHECK(c->evaluate(s, {}).get().value == outrun::Value(int64_t{666}));
  good_value(t1_after(13), 26.0f);
  REQUIRE(!c->unregister_script("tag:T1"));
  good_value(t1_after(14), 28.0f);
  CHECK(d.stop() == 0);
}

TEST_CASE(
    "outrund tenancy: only the uid that registered a key, or an admin, replaces or "
    "unregisters it, and a replaced record is charged to nobody") {
  if (geteuid() != 0) {
    MESSAGE("not root: needs a second uid; skipped");
    return;
  }
  // root is an admin (the default admin_uids: the daemon's uid and root); nobody is not.
  TempFile conf("[daemon]\nallowed_uids = [0, 65534]\nsocket_mode = \"0666\"\n");
  Daemon d({"--config", conf.path});
  REQUIRE(chmod(d.dir.c_str(), 0711) == 0);  // nobody may reach the socket
  std::string big = "return 7 --";
  big.resize(64 << 10, 'x');
  // nobody's child is forked before this process has threads of its own (TSan refuses threads
  // after a multi-threaded fork), and waits until root has registered its key.
  int go[2];
  REQUIRE(pipe(go) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(go[1]);
    char byte = 0;
    if (read(go[0], &byte, 1) != 1) _exit(89);
    if (setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(90);
    outrun::ClientOptions o;
    o.socket = d.socket;
    o.server_uids = {0};
    std::unique_ptr<outrun::Client> n;
    if (outrun::Client::connect(o, &n)) _exit(91);
    outrun::Script s;
    // Replacing root's key: refused, and nothing changed.
    outrun::Error e = n->register_script("root.k", "return 2", &s);
    if (e.code != outrun::ErrorCode::invalid_argument) _exit(92);
    if (e.message.find("permission denied: uid 65534 may not replace 'root.k', registered by "
                       "uid 0") == std::string::npos)
      _exit(93);
    // The same source is no replacement: a look-up, allowed (handles are daemon-wide).
    if (n->register_script("root.k", "return 1", &s)) _exit(94);
    if (n->evaluate(s, {}).get().value != outrun::Value(int64_t{1})) _exit(95);
    e = n->unregister_script("root.k");
    if (e.code != outrun::ErrorCode::invalid_argument) _exit(96);
    if (e.message.find("permission denied: uid 65534 may not unregister 'root.k'") ==
        std::string::npos)
      _exit(97);
    // Its own key: it may replace it (twice) and unregister it.
    if (n->register_script("nobody.k", "return 3", &s)) _exit(98);
    if (n->register_script("nobody.k", "return 4", &s)) _exit(99);
    if (n->evaluate(s, {}).get().value != outrun::Value(int64_t{4})) _exit(100);
    if (n->unregister_script("nobody.k")) _exit(101);
    // A key root (an admin) will replace.
    if (n->register_script("nobody.big", big, &s)) _exit(102);
    _exit(0);
  }
  close(go[0]);
  auto c = d.client();
  outrun::Script root_s;
  REQUIRE(!c->register_script("root.k", "return 1", &root_s));
  REQUIRE(write(go[1], "g", 1) == 1);
  close(go[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(c->evaluate(root_s, {}).get().value == outrun::Value(int64_t{1}));  // untouched
  CHECK(quota_of(d, "65534")["scripts"] == 1);  // nobody.big: its replaced records went
  // An admin may replace another uid's key: the replaced record's charge goes with it.
  outrun::Script s;
  REQUIRE(!c->register_script("nobody.big", "return 8", &s));
  CHECK(quota_of(d, "65534")["scripts"] == 0);
  CHECK(quota_of(d, "65534")["bytes"] == 0);
  CHECK(c->evaluate(s, {}).get().value == outrun::Value(int64_t{8}));
  REQUIRE(!c->unregister_script("nobody.big"));
  REQUIRE(!c->unregister_script("root.k"));
  CHECK(d.stats()["registry"]["quota"]["uids"].empty());
  CHECK(d.stop() == 0);
}

TEST_CASE(
    "outrund tenancy: quota ping-pong: replacing a key again and again frees each old "
    "record's charge") {
  // 4 MiB per uid and 1 MiB sources: before, each replaced record stayed charged (its handle
  // stayed valid), so the fourth round was refused.
  TempFile conf("[daemon]\nmax_registry_bytes_per_uid = 4194304\n");
  Daemon d({"--config", conf.path});
  Raw victim(d.socket), other(d.socket);
  std::string big = "return 1 --";
  big.resize(outrun::kMaxSourceSize - 64, 'v');
  std::string small = "return 2";
  uint64_t first = 0;
  for (int round = 0; round < 200; ++round) {
    big.back() = static_cast<char>('a' + round % 2);  // a new source each round
    const Raw::Reg r = victim.reg("victim.k", big);
    INFO("round " << round << ": " << r.error);
    REQUIRE(r.status == wire::Status::Ok);
    if (round == 0) first = r.handle64;
    // Another connection of the same uid replaces it (the victim's uid owns the key).
    REQUIRE(other.reg("victim.k", small + " --" + std::to_string(round)).status ==
            wire::Status::Ok);
  }
  CHECK(quota_of(d, "0")["scripts"] == 1);
  CHECK(d.stats()["registry"]["scripts"] == 1);  // replaced records are freed
  // The first round's handle names a record that was replaced, never another script.
  const Raw::Res old = victim.eval(first);
  CHECK(old.status == wire::Status::InvalidArgument);
  CHECK((old.error.find("no longer registered") != std::string::npos ||
         old.error.find("was replaced") != std::string::npos));
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund tenancy: a stale handle is refused however often its record id is reused") {
  Daemon d;
  Raw victim(d.socket), attacker(d.socket), old(d.socket, 2);
  const Raw::Reg v = victim.reg("victim.k", "return 1111");
  REQUIRE(v.status == wire::Status::Ok);
  CHECK(v.handle == 0);  // protocol 3: no 32-bit handle
  CHECK(victim.eval(v.handle64).value == 1111);
  // The same script for a protocol 2 client: its 32-bit form.
  const Raw::Reg lv = old.reg("victim.k", "return 1111");
  REQUIRE(lv.status == wire::Status::Ok);
  REQUIRE(lv.handle64 == v.handle64);
  REQUIRE(lv.handle == static_cast<uint32_t>(v.handle64));
  CHECK(old.eval(0, lv.handle).value == 1111);
  REQUIRE(victim.unreg("victim.k").first == wire::Status::Ok);
  const uint64_t id_mask = (uint64_t{1} << 22) - 1;
  // Register/unregister cycles until the victim's record id was given to the attacker's script
  // more than 2^10 times (the old 10-bit generation wrapped at 1,024); after each reuse, the
  // victim's handles are refused, never answered with the attacker's result.
  int reuses = 0, cycles = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (reuses < 1100 && cycles < 50000) {
    ++cycles;
    const Raw::Reg a = attacker.reg("attacker.k", "return 666");
    REQUIRE(a.status == wire::Status::Ok);
    if ((a.handle64 & id_mask) == (v.handle64 & id_mask)) {
      ++reuses;
      REQUIRE(a.handle64 != v.handle64);
      const Raw::Res r = victim.eval(v.handle64);
      INFO("reuse " << reuses << ": " << r.error);
      REQUIRE(r.status == wire::Status::InvalidArgument);
      REQUIRE(r.error.find("handle no longer registered") != std::string::npos);
      const Raw::Res legacy = old.eval(0, lv.handle);
      INFO("32-bit handle: " << legacy.error);
      REQUIRE(legacy.status == wire::Status::InvalidArgument);
    }
    REQUIRE(attacker.unreg("attacker.k").first == wire::Status::Ok);
  }
  MESSAGE(cycles << " cycles, " << reuses << " reuses of the victim's record id in "
                 << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                 << " s");
  CHECK(reuses >= 1100);
  // A protocol 2 client cannot be given a handle past the 32-bit form's 1,023 generations.
  const Raw::Reg o = old.reg("attacker.k", "return 666");
  if ((o.handle64 & id_mask) == (v.handle64 & id_mask)) {
    CHECK(o.status == wire::Status::InvalidArgument);
    CHECK(o.error.find("protocol 3") != std::string::npos);
  }
  CHECK(d.stop() == 0);
}
