// outrund's tags engine bounded per client in memory and time (design/daemon.md "Tags bounds"):
// each attack of the tags frames at a scale a test runs quickly, through outrun::Client and raw
// frames.
#include <doctest/doctest.h>
#include <flatbuffers/flatbuffers.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "daemon_support.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/outrun_generated.h"
#include "outrun/tags.h"

namespace {

using namespace std::chrono_literals;
using namespace outrun::test;
namespace tags = outrun::tags;
namespace wire = outrun::wire;

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& text, const char* name = "outrund-tb") {
    char tmpl[64];
    std::snprintf(tmpl, sizeof tmpl, "/tmp/%s-XXXXXX", name);
    const int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
    std::ofstream(path) << text;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

tags::SourceUpdate good(const std::string& tag, outrun::Value v) {
  tags::SourceUpdate u;
  u.tag = tag;
  u.value.value = std::move(v);
  u.value.status = tags::codes::Good;
  return u;
}

// c0 <- c1 <- ... <- c(n-1) <- src: each tag's input is the next one.
std::string chain_toml(int n) {
  std::string t;
  t.reserve(static_cast<std::size_t>(n) * 96);
  for (int i = 0; i < n; ++i) {
    const std::string in = i + 1 < n ? "c" + std::to_string(i + 1) : std::string("src");
    t += "[[tag]]\nid = \"c" + std::to_string(i) + "\"\ninputs = [{tag = \"" + in +
         "\", name = \"x\"}]\nscript = \"return inputs.x\"\n";
  }
  return t;
}

long status_kb(pid_t pid, const char* key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key)));
  return -1;
}

void send_frame(int fd, flatbuffers::FlatBufferBuilder& f) {
  const auto* p = f.GetBufferPointer();
  std::size_t left = f.GetSize();
  while (left > 0) {
    const ssize_t n = write(fd, p, left);
    REQUIRE(n > 0);
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

// A raw connection that said hello.
int hello(const Daemon& d) {
  const int fd = connect_raw(d.socket);
  flatbuffers::FlatBufferBuilder f;
  outrun::protocol::encode_client_hello(f, "t");
  send_frame(fd, f);
  return fd;
}

// The TagsReply or TagValues answering `rid` (skipping other frames).
struct Answer {
  wire::Status status = wire::Status::Ok;
  std::string error, json;
  std::size_t values = 0;
  bool closed = false;
};
Answer answer_to(int fd, outrun::protocol::FrameReader& reader, uint64_t rid) {
  for (;;) {
    outrun::protocol::FrameView fv;
    while (reader.next(fv)) {
      Answer a;
      if (const auto* r = fv.frame->body_as_TagsReply(); r && r->request_id() == rid) {
        a.status = r->status();
        if (r->error()) a.error = r->error()->str();
        if (r->json()) a.json = r->json()->str();
        return a;
      }
      if (const auto* r = fv.frame->body_as_TagValues(); r && r->request_id() == rid) {
        a.status = r->status();
        if (r->error()) a.error = r->error()->str();
        a.values = r->values() ? r->values()->size() : 0;
        return a;
      }
    }
    if (reader.read_from(fd) <= 0) {
      Answer a;
      a.closed = true;
      return a;
    }
  }
}

}  // namespace

// Item 10: DefineTags of a 100,000-deep chain ended outrund with SIGSEGV (recursion in the cycle
// check). Now it is refused by the definition's bound, with the bound named, and the same
// connection goes on; a tags file of it at start is refused by max_tags (exit 2), no crash.
TEST_CASE("outrund tags bounds: a 100,000-deep chain is refused by a named bound, outrund lives") {
  const std::string chain = chain_toml(100'000);
  REQUIRE(chain.size() < outrun::protocol::kMaxFrameSize - 4096);
  Daemon d;
  // Parsing 100,000 definitions before the bound refuses them takes seconds under TSan on a
  // loaded machine (over the client's default 10 s once): this case is about the refusal.
  outrun::ClientOptions o;
  o.socket = d.socket;
  o.reply_timeout = std::chrono::minutes(2);
  std::unique_ptr<outrun::Client> c;
  REQUIRE(!outrun::Client::connect(o, &c));
  outrun::Error e = c->define_tags(chain, false);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("max_tags_per_define") != std::string::npos, e.message);
  std::string json;
  REQUIRE(!c->list_tags_json(&json));  // the same connection, answered
  CHECK(nlohmann::json::parse(json)["tags"].empty());
  CHECK(d.stop() == 0);

  // --tags: refused by max_tags at start (exit 2, the bound named), not a crash.
  TempFile file(chain, "outrund-chain");
  TempFile conf("[daemon]\nmax_tags = 50000\n");
  const std::string dir = temp_dir();
  // (No structured binding: clang 14's check-threads refuses one captured by CHECK_MESSAGE.)
  const auto result = run_command(
      std::string(OUTRUN_TEST_DAEMON) + " --socket " + dir + "/o.sock --worker " +
      OUTRUN_TEST_WORKER + " --shards 1 --config " + conf.path + " --tags " + file.path + " 2>&1");
  const std::string& out = result.second;
  CHECK(result.first == 2);
  CHECK_MESSAGE(out.find("max_tags (50000)") != std::string::npos, out);
  std::remove((dir + "/o.sock").c_str());
  rmdir(dir.c_str());
}

// A chain within the bounds whose source goes Bad: every tag shows the source's code, through
// a wave that passes 3,000 tags without evaluating one (it recursed once per tag).
TEST_CASE("outrund tags bounds: a Bad source passes down a 3,000-deep chain") {
  Daemon d;
  auto c = d.client();
  REQUIRE(!c->define_tags(chain_toml(3000), false));
  tags::SourceUpdate bad = good("src", outrun::Value(1.0));
  bad.value.status = tags::codes::BadSensorFailure;
  REQUIRE(!c->update_sources({bad}));
  bool done = false;
  for (int i = 0; i < 500 && !done; ++i) {
    std::vector<tags::Change> v;
    REQUIRE(!c->read_tags({"c0"}, &v));
    done = v[0].value.status == tags::codes::BadSensorFailure;
    if (!done) std::this_thread::sleep_for(20ms);
  }
  CHECK(done);
  CHECK(d.stop() == 0);
}

// Item 4: sources are bounded by count and bytes (total and per uid) and by one value's size;
// only an admin creates one; the ones a connection created that no tag reads go with it.
TEST_CASE("outrund tags bounds: source tags: who creates them, their bounds, freed at close") {
  TempFile conf(
      "[daemon]\nmax_tag_source_value_bytes = 65536\nmax_tag_sources_per_uid = 100\n"
      "max_tag_source_bytes_per_uid = 262144\n");
  Daemon d({"--config", conf.path});
  auto c = d.client();  // the daemon's own uid: an admin
  // One value past max_tag_source_value_bytes.
  outrun::Error e = c->update_sources({good("v", outrun::Value(std::string(70'000, 'x')))});
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("max_source_value_bytes (65536)") != std::string::npos, e.message);
  // Count per uid: 100 new ids, then one more.
  std::vector<tags::SourceUpdate> many;
  for (int i = 0; i < 100; ++i) many.push_back(good("n" + std::to_string(i), outrun::Value(1.0)));
  REQUIRE(!c->update_sources(many));
  e = c->update_sources({good("n100", outrun::Value(1.0))});
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("max_uid_sources (100)") != std::string::npos, e.message);
  // Bytes per uid: 60 KB values on ids that exist, five of them pass 256 KiB.
  std::vector<tags::SourceUpdate> big;
  for (int i = 0; i < 5; ++i)
    big.push_back(good("n" + std::to_string(i), outrun::Value(std::string(60'000, 'y'))));
  e = c->update_sources(big);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("max_uid_bytes (262144)") != std::string::npos, e.message);
  big.pop_back();
  REQUIRE(!c->update_sources(big));  // four fit
  // The same connection goes on; the sources are readable.
  std::vector<tags::Change> v;
  REQUIRE(!c->read_tags({"n99"}, &v));
  // At close, the sources it created that no tag reads go (and its count with them).
  c.reset();
  auto c2 = d.client();
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = c2->read_tags({"n99"}, &v).code == outrun::ErrorCode::invalid_argument;
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  CHECK(gone);
  REQUIRE(!c2->update_sources(many));  // its uid may create them again
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund tags bounds: a non-admin updates the sources that exist, creates none") {
  TempFile tagsfile("[[tag]]\nid = \"f\"\ninputs = [\"a\"]\nscript = \"return inputs.a * 2\"\n",
                    "outrund-t");
  TempFile conf("[daemon]\nadmin_uids = [4242]\n");
  Daemon d({"--config", conf.path, "--tags", tagsfile.path});
  auto c = d.client();                                           // not an admin
  REQUIRE(!c->update_sources({good("a", outrun::Value(2.0))}));  // an input of f: it exists
  outrun::Error e = c->update_sources({good("zz", outrun::Value(2.0))});
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("unknown source tag 'zz'") != std::string::npos, e.message);
  std::vector<tags::Change> v;
  CHECK(c->read_tags({"zz"}, &v).code == outrun::ErrorCode::invalid_argument);
  REQUIRE(!c->read_tags({"a"}, &v));  // the connection goes on
  CHECK(d.stop() == 0);
}

// Item 5: Subscribe ids are bounded per connection (max_subscribed_ids), whatever they name.
TEST_CASE("outrund tags bounds: subscribed ids per connection are bounded") {
  TempFile conf("[daemon]\nmax_subscribed_ids = 1000\n");
  Daemon d({"--config", conf.path});
  const int fd = hello(d);
  outrun::protocol::FrameReader reader;
  flatbuffers::FlatBufferBuilder f;
  auto subscribe = [&](uint64_t rid, int from, int n) {
    std::vector<std::string> ids;
    for (int i = from; i < from + n; ++i) ids.push_back("nothing." + std::to_string(i));
    f.Clear();
    outrun::protocol::encode_subscribe(f, rid, ids, false);
    send_frame(fd, f);
    return answer_to(fd, reader, rid);
  };
  CHECK(subscribe(1, 0, 600).status == wire::Status::Ok);
  const Answer a = subscribe(2, 600, 600);
  REQUIRE_FALSE(a.closed);
  CHECK(a.status == wire::Status::InvalidArgument);
  CHECK_MESSAGE(a.error.find("max_subscribed_ids (1000)") != std::string::npos, a.error);
  CHECK(subscribe(3, 600, 400).status == wire::Status::Ok);  // up to the bound
  close(fd);
  CHECK(d.stop() == 0);
}

// Item 8: a ReadTags that names one large source many times is refused once its values pass a
// frame, before they are all copied and encoded (it used to build the whole reply first).
TEST_CASE("outrund tags bounds: a ReadTags larger than a frame stops at the limit") {
  Daemon d;
  auto c = d.client();
  REQUIRE(!c->update_sources({good("big", outrun::Value(std::string(1'000'000, 'b')))}));
  const long hwm0 = status_kb(d.pid, "VmHWM:");
  std::vector<tags::Change> v;
  outrun::Error e = c->read_tags(std::vector<std::string>(200, "big"), &v);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("read fewer ids") != std::string::npos, e.message);
  const long hwm1 = status_kb(d.pid, "VmHWM:");
  MESSAGE("outrund peak RSS " << hwm0 / 1024 << " -> " << hwm1 / 1024 << " MB");
  CHECK(hwm1 - hwm0 < 120 * 1024);  // about a frame; 200 copies and their encoding were 400 MB
  REQUIRE(!c->read_tags(std::vector<std::string>(10, "big"), &v));  // what fits is read
  CHECK(v.size() == 10);
  CHECK(d.stop() == 0);
}

// Item 6: ListTags is paged like ListScripts: at most `limit` tags per reply, `next` the cursor.
TEST_CASE("outrund tags bounds: ListTags is paged") {
  Daemon d;
  auto c = d.client();
  std::string toml;
  for (int i = 0; i < 2500; ++i)
    toml += "[[tag]]\nid = \"t" + std::to_string(i) + "\"\ninputs = [\"s\"]\nscript = \"return " +
            "inputs.s\"\n";
  REQUIRE(!c->define_tags(toml, false));
  const int fd = hello(d);
  outrun::protocol::FrameReader reader;
  flatbuffers::FlatBufferBuilder f;
  std::set<std::string> seen;
  std::string after;
  int pages = 0;
  for (uint64_t rid = 1;; ++rid) {
    f.Clear();
    outrun::protocol::encode_list_tags(f, rid, after, 1000);
    send_frame(fd, f);
    const Answer a = answer_to(fd, reader, rid);
    REQUIRE(a.status == wire::Status::Ok);
    const auto j = nlohmann::json::parse(a.json);
    CHECK(j["total"] == 2500);
    CHECK(j["tags"].size() <= 1000);
    for (const auto& t : j["tags"]) CHECK(seen.insert(t["id"].get<std::string>()).second);
    ++pages;
    if (j["next"].is_null()) break;
    after = j["next"].get<std::string>();
    REQUIRE(pages < 10);
  }
  CHECK(pages == 3);
  CHECK(seen.size() == 2500);
  // A cursor that is not a tag: InvalidArgument, the connection kept.
  f.Clear();
  outrun::protocol::encode_list_tags(f, 99, "nope", 10);
  send_frame(fd, f);
  const Answer a = answer_to(fd, reader, 99);
  REQUIRE_FALSE(a.closed);
  CHECK(a.status == wire::Status::InvalidArgument);
  close(fd);
  CHECK(d.stop() == 0);
}

namespace {
// On_read tags r0..r(n-1) whose script spins `seconds` (max_age 1 ms: every read evaluates).
std::string slow_on_read(int n, double seconds) {
  std::string t;
  for (int i = 0; i < n; ++i)
    t += "[[tag]]\nid = \"r" + std::to_string(i) +
         "\"\ninputs = [\"x\"]\ntrigger = \"on_read\"\nmax_age_ms = 1\n"
         "script = \"local t = os.clock() while os.clock() - t < " +
         std::to_string(seconds) + " do end return inputs.x\"\n";
  return t;
}
}  // namespace

// Item 7: a ReadTags evaluates each distinct on_read tag once and at most max_read_evaluations
// of them; reads wait on their own thread, each connection in turn, so a flood of them neither
// drops nor delays a SIGHUP reload, and SIGTERM still ends outrund promptly.
TEST_CASE("outrund tags bounds: on_read reads are capped per request and per client") {
  const std::string dir = temp_dir();
  const std::string log = dir + "/outrund.log";
  TempFile tagsfile(slow_on_read(6, 0.05), "outrund-r");
  TempFile conf("[daemon]\nmax_read_evaluations = 4\n");
  Daemon d({"--config", conf.path, "--tags", tagsfile.path, "--timeout", "5000", "--log-level",
            "info", "--log-file", log});
  auto c = d.client();
  REQUIRE(!c->update_sources({good("x", outrun::Value(3.0))}));
  std::vector<tags::Change> v;
  // Five distinct on_read tags: more than max_read_evaluations.
  outrun::Error e = c->read_tags({"r0", "r1", "r2", "r3", "r4"}, &v);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("max_read_evaluations (4)") != std::string::npos, e.message);
  // One tag named 2,000 times is evaluated once (it was 2,000 × 50 ms).
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(!c->read_tags(std::vector<std::string>(2000, "r5"), &v));
  CHECK(v.size() == 2000);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);

  // A flood: 60 ReadTags of 500 × r0 from one connection. Most are Busy at once (4 queued per
  // connection); a SIGHUP reload runs at once, not behind them.
  const int fd = hello(d);
  flatbuffers::FlatBufferBuilder f;
  const std::vector<std::string> ids(500, "r0");
  for (uint64_t rid = 1; rid <= 60; ++rid) {
    f.Clear();
    outrun::protocol::encode_read_tags(f, rid, ids);
    send_frame(fd, f);
  }
  std::this_thread::sleep_for(200ms);
  kill(d.pid, SIGHUP);
  bool reloaded = false;
  for (int i = 0; i < 300 && !reloaded; ++i) {
    reloaded = read_all(log).find("SIGHUP: tags file") != std::string::npos;
    if (!reloaded) std::this_thread::sleep_for(10ms);
  }
  CHECK_MESSAGE(reloaded, read_all(log));
  CHECK(read_all(log).find("reload not started") == std::string::npos);
  // An honest client's own read is served in its turn.
  auto honest = d.client();
  t0 = std::chrono::steady_clock::now();
  REQUIRE(!honest->read_tags({"r1"}, &v));
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  // SIGTERM ends it promptly, reads still queued or not.
  t0 = std::chrono::steady_clock::now();
  CHECK(d.stop() == 0);
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  close(fd);
  std::remove(log.c_str());
  rmdir(dir.c_str());
}
