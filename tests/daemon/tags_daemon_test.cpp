// outrund's tags engine through the real daemon: the tags frames with outrun::Client, raw frames,
// subscribers, --tags and SIGHUP, the CLI (design/protocol.md "Tags frames", design/daemon.md).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <flatbuffers/flatbuffers.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
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

const char* kTags = R"(
[[tag]]
id = "f"
type = "Float"
inputs = ["a"]
script = "return inputs.a * 2"

[[tag]]
id = "u"
type = "UInt16"
inputs = ["a"]
script = "return inputs.a + 1"
)";

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, tags::DataValue> latest;
  std::size_t count = 0;
  void operator()(const std::vector<tags::Change>& changes) {
    // Notified under the lock: a waiter that returns and destroys this cannot race the notify.
    std::lock_guard lock(mu);
    for (const auto& c : changes) latest[c.tag] = c.value;
    count += changes.size();
    cv.notify_all();
  }
  template <class Pred>
  bool wait(Pred p, std::chrono::milliseconds t = 10s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, t, [&] { return p(latest); });
  }
};

tags::SourceUpdate good(const std::string& tag, outrun::Value v) {
  tags::SourceUpdate u;
  u.tag = tag;
  u.value.value = std::move(v);
  u.value.status = tags::codes::Good;
  return u;
}

std::string write_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void send_frame(int fd, flatbuffers::FlatBufferBuilder& f) {
  REQUIRE(write(fd, f.GetBufferPointer(), f.GetSize()) == static_cast<ssize_t>(f.GetSize()));
}

bool closed_by_peer(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

long rss_kb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace

TEST_CASE(
    "outrund tags: define, update, subscribe: Float arrives as Float, UInt16 as UInt, Bad "
    "propagates") {
  Daemon d;
  auto c = d.client();
  std::string json;
  REQUIRE(!c->define_tags(kTags, false, &json));
  const auto j = nlohmann::json::parse(json);
  CHECK(j["defined"] == nlohmann::json::array({"f", "u"}));
  CHECK(j["removed"] == nlohmann::json::array());

  Collector col;  // before the client: its reader thread calls it until the client is gone
  auto sub = d.client();
  REQUIRE(!sub->subscribe({}, std::ref(col)));
  REQUIRE(!c->update_sources({good("a", outrun::Value(3.0))}));
  REQUIRE(col.wait([](auto& m) { return m.count("f") && m.count("u"); }));
  {
    std::lock_guard lock(col.mu);
    const auto& f = col.latest["f"];
    REQUIRE(f.value.is<float>());
    CHECK(f.value.as<float>() == 6.0f);
    CHECK(f.status == tags::codes::Good);
    const auto& u = col.latest["u"];
    REQUIRE(u.value.is<uint64_t>());
    CHECK(u.value.as<uint64_t>() == 4u);
  }
  // A Bad source gives a Bad virtual tag.
  tags::SourceUpdate bad = good("a", outrun::Value(5.0));
  bad.value.status = tags::codes::BadSensorFailure;
  REQUIRE(!c->update_sources({bad}));
  REQUIRE(col.wait([](auto& m) { return tags::severity(m["f"].status) == tags::Severity::bad; }));

  // ReadTags: values in order; an unknown id is InvalidArgument.
  std::vector<tags::Change> values;
  REQUIRE(!c->read_tags({"u", "a"}, &values));
  REQUIRE(values.size() == 2);
  CHECK(values[0].tag == "u");
  CHECK(values[1].tag == "a");
  CHECK(values[1].value.status == tags::codes::BadSensorFailure);
  outrun::Error e = c->read_tags({"u", "nope"}, &values);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK(e.message.find("nope") != std::string::npos);

  // ListTags: both, with counters.
  REQUIRE(!c->list_tags_json(&json));
  const auto l = nlohmann::json::parse(json);
  REQUIRE(l["tags"].size() == 2);
  CHECK(l["tags"][0]["id"] == "f");
  CHECK(l["tags"][0]["type"] == "Float");
  CHECK(l["tags"][0]["counters"]["evaluations"].get<int>() >= 1);

  // RemoveTags: u goes; f stays.
  REQUIRE(!c->remove_tags({"u"}));
  REQUIRE(!c->list_tags_json(&json));
  CHECK(nlohmann::json::parse(json)["tags"].size() == 1);
  CHECK(c->remove_tags({"zz"}).code == outrun::ErrorCode::invalid_argument);
}

// An on_read tag "slow" (max_age 1 ms) whose script spins `seconds`, over the source x = `x`.
void define_slow_tag(outrun::Client& c, double seconds, double x, bool doubled = true) {
  const std::string toml =
      "[[tag]]\nid = \"slow\"\ninputs = [\"x\"]\ntrigger = \"on_read\"\nmax_age_ms = 1\n"
      "script = \"local t = os.clock() while os.clock() - t < " +
      std::to_string(seconds) + " do end return inputs.x" + (doubled ? " * 2" : "") + "\"\n";
  REQUIRE(!c.define_tags(toml, false));
  REQUIRE(!c.update_sources({good("x", outrun::Value(x))}));
}

// The daemon serves its clients on the Host's loop thread (design/daemon.md "One loop"): a read
// that waits for an on_read tag's evaluation waits on the tags thread, never on that loop, which
// reads the evaluation's result and keeps answering everyone else meanwhile.
TEST_CASE("outrund tags: a read waiting for an on_read evaluation does not stop the daemon") {
  Daemon d({"--timeout", "5000"});
  auto a = d.client();
  auto b = d.client();
  define_slow_tag(*a, 0.4, 21.0);  // slow = x * 2
  std::atomic<bool> read_done{false};
  std::vector<tags::Change> v;
  outrun::Error read_err;
  std::thread reader([&] {
    read_err = a->read_tags({"slow"}, &v);
    read_done = true;
  });
  std::this_thread::sleep_for(50ms);  // the read is waiting for its 0.4 s evaluation
  std::string json;
  REQUIRE(!b->list_tags_json(&json));  // answered by the loop meanwhile
  CHECK_FALSE(read_done.load());
  REQUIRE(!b->stats_json(&json));
  reader.join();
  REQUIRE(!read_err);
  REQUIRE(v.size() == 1);
  CHECK(v[0].value.value.as<double>() == 42.0);
}

// More waiting reads than the tags thread queues: each ReadTags is still answered once, with
// the body a ReadTags always gets (TagValues), Busy for those refused.
TEST_CASE(
    "outrund tags: waiting reads past the tags queue are answered TagValues Busy, once each") {
  Daemon d({"--timeout", "5000"});
  auto a = d.client();
  define_slow_tag(*a, 0.02, 7.0, /*doubled=*/false);
  const int fd = connect_raw(d.socket);
  flatbuffers::FlatBufferBuilder f;
  outrun::protocol::encode_client_hello(f, "t");
  send_frame(fd, f);
  constexpr int kReads = 90;  // the queue holds 64, one runs
  const std::string id = "slow";
  for (int i = 1; i <= kReads; ++i) {
    f.Clear();
    outrun::protocol::encode_read_tags(f, static_cast<uint64_t>(i), {&id, 1});
    send_frame(fd, f);
  }
  outrun::protocol::FrameReader reader;
  std::map<uint64_t, int> answers;
  int ok = 0, busy = 0, hellos = 0;
  while (static_cast<int>(answers.size()) < kReads) {
    const long n = reader.read_from(fd);
    REQUIRE(n > 0);
    outrun::protocol::FrameView fv;
    while (reader.next(fv)) {
      if (fv.frame->body_type() == wire::Body::ServerHello) {
        ++hellos;
        continue;
      }
      REQUIRE(fv.frame->body_type() == wire::Body::TagValues);
      const auto* tv = fv.frame->body_as_TagValues();
      ++answers[tv->request_id()];
      if (tv->status() == wire::Status::Ok) ++ok;
      if (tv->status() == wire::Status::Busy) ++busy;
    }
  }
  close(fd);
  CHECK(hellos == 1);
  for (int i = 1; i <= kReads; ++i) CHECK(answers[static_cast<uint64_t>(i)] == 1);
  CHECK(ok + busy == kReads);
  CHECK(ok >= 1);
  CHECK(busy >= 1);
}

// A ListTags document without the counters (they move with every evaluation).
static nlohmann::json without_counters(const std::string& doc) {
  auto js = nlohmann::json::parse(doc);
  for (auto& t : js["tags"]) t.erase("counters");
  return js;
}

TEST_CASE("outrund tags: broken definitions are isolated, a bad text changes nothing") {
  Daemon d;
  auto c = d.client();
  REQUIRE(!c->define_tags(kTags, false));
  REQUIRE(!c->update_sources({good("a", outrun::Value(10.0))}));
  // f no longer compiles, g has an unknown key, h is fine: f and g get BadConfigurationError
  // with FILE:LINE:COL (the text has no file: LINE:COL), every error is reported, u and h run.
  std::string json;
  REQUIRE(
      !c->define_tags("[[tag]]\nid = \"f\"\ninputs = [\"a\"]\nscript = \"return (\"\n"
                      "[[tag]]\nid = \"g\"\nbogus = 1\nscript = \"return 1\"\n"
                      "[[tag]]\nid = \"h\"\ninputs = [\"f\"]\nscript = \"return 1\"\n",
                      false, &json));
  const auto j = nlohmann::json::parse(json);
  CHECK(j["broken"] == nlohmann::json::array({"f", "g"}));
  REQUIRE(j["errors"].size() == 2);
  CHECK(j["errors"][0]["location"] == "4:1");
  CHECK(j["errors"][0]["code"] == "compile_error");
  CHECK(j["errors"][1]["location"] == "7:9");
  CHECK(j["errors"][1]["message"].get<std::string>().find("unknown key 'bogus'") !=
        std::string::npos);
  std::vector<tags::Change> v;
  REQUIRE(!c->read_tags({"f", "g", "h", "u"}, &v));
  CHECK(v[0].value.status == tags::codes::BadConfigurationError);
  CHECK(v[0].value.value.is_nil());
  CHECK(v[0].value.diagnostics.rfind("4:1: tag 'f': compile_error: ", 0) == 0);
  CHECK(v[1].value.status == tags::codes::BadConfigurationError);
  // h depends on the broken f: not evaluated, f's status by the quality rule.
  CHECK(v[2].value.status == tags::codes::BadConfigurationError);
  CHECK(v[2].value.diagnostics.find("not evaluated: input 'f'") != std::string::npos);
  CHECK(v[3].value.status == tags::codes::Good);  // u runs on
  // A text that is not TOML changes nothing.
  std::string before, after;
  REQUIRE(!c->list_tags_json(&before));
  outrun::Error e = c->define_tags("[[tag]\nid = 1\n", true);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK(e.message.rfind("1:", 0) == 0);  // LINE:COL: message
  REQUIRE(!c->list_tags_json(&after));
  CHECK(without_counters(before) == without_counters(after));
}

TEST_CASE("outrund tags: tags_strict refuses a set with a broken definition and changes nothing") {
  const std::string dir = temp_dir();
  const std::string conf = write_file(dir, "outrund.toml", "[daemon]\ntags_strict = true\n");
  Daemon d({"--config", conf});
  auto c = d.client();
  REQUIRE(!c->define_tags(kTags, false));
  std::string before, after;
  REQUIRE(!c->list_tags_json(&before));
  outrun::Error e = c->define_tags(
      "[[tag]]\nid = \"f\"\ninputs = [\"a\"]\nscript = \"return (\"\n"
      "[[tag]]\nid = \"g\"\nbogus = 1\nscript = \"return 1\"\n",
      /*replace_all=*/true);
  CHECK(e.code == outrun::ErrorCode::compile_error);
  CHECK(e.message.find("tag 'f'") != std::string::npos);
  CHECK(e.message.find("7:9: tag 'g': unknown key 'bogus'") != std::string::npos);  // every one
  REQUIRE(!c->list_tags_json(&after));
  CHECK(without_counters(before) == without_counters(after));
  CHECK(d.stop() == 0);
  std::remove(conf.c_str());
  rmdir(dir.c_str());
}

TEST_CASE("outrund tags: DefineTags and RemoveTags need an admin uid, updates and reads do not") {
  char tmpl[] = "/tmp/outrund-conf-XXXXXX";
  const int fd = mkstemp(tmpl);
  REQUIRE(fd >= 0);
  close(fd);
  const std::string conf = tmpl;
  std::ofstream(conf) << "[daemon]\nadmin_uids = [4242]\n";
  const std::string dir = temp_dir();
  const std::string file = write_file(dir, "t.toml", kTags);
  Daemon d({"--config", conf, "--tags", file});
  auto c = d.client();
  outrun::Error e = c->define_tags(kTags, false);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK(e.message.find("permission denied") != std::string::npos);
  CHECK(c->remove_tags({"f"}).code == outrun::ErrorCode::invalid_argument);
  // A source that exists (an input of f and u): updated by anyone; creating one is an admin's.
  CHECK(!c->update_sources({good("a", outrun::Value(1.0))}));
  CHECK(c->update_sources({good("new", outrun::Value(1.0))}).code ==
        outrun::ErrorCode::invalid_argument);
  std::string json;
  REQUIRE(!c->list_tags_json(&json));
  CHECK(nlohmann::json::parse(json)["tags"].size() == 2);
  std::remove(conf.c_str());
  std::remove(file.c_str());
  rmdir(dir.c_str());
}

TEST_CASE("outrun reload waits for the tags file's reload and fails when it did not apply") {
  const std::string dir = temp_dir();
  const std::string file = write_file(dir, "tags.toml", kTags);
  Daemon d({"--tags", file});
  const std::string cli = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket + " reload";
  auto c = d.client();
  REQUIRE(!c->update_sources({good("a", outrun::Value(10.0))}));
  // Changed: f = a * 3. When `outrun reload` returns, the new script is there, no waiting.
  std::string changed = kTags;
  changed.replace(changed.find("inputs.a * 2"), 12, "inputs.a * 3");
  write_file(dir, "tags.toml", changed);
  int rc = 0;
  std::string out;  // not a structured binding: CHECK_MESSAGE captures it (clang 14)
  std::tie(rc, out) = run_command(cli + " 2>&1");
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out == "reloaded\n");
  std::string json;
  REQUIRE(!c->list_tags_json(&json));
  const auto j = nlohmann::json::parse(json);
  bool seen = false;
  for (const auto& t : j["tags"])
    if (t["id"] == "f") seen = t["version"].get<uint64_t>() == 2;
  CHECK_MESSAGE(seen, json);
  // Not TOML: exit 1, the error with its line, the running tags kept.
  write_file(dir, "tags.toml", "[[tag]\nid = \"f\"\nscript = 7\n");
  std::tie(rc, out) = run_command(cli + " 2>&1");
  CHECK(rc == 1);
  CHECK_MESSAGE(out.find("tags.toml:1:") != std::string::npos, out);
  CHECK_MESSAGE(out.find("reload failed") != std::string::npos, out);
  // Fixed again: 0.
  write_file(dir, "tags.toml", kTags);
  std::tie(rc, out) = run_command(cli + " 2>&1");
  CHECK_MESSAGE(rc == 0, out);
  CHECK(d.stop() == 0);
  std::remove(file.c_str());
  rmdir(dir.c_str());
}

TEST_CASE("outrund tags: --tags FILE at start, SIGHUP reloads it, broken tags are isolated") {
  const std::string dir = temp_dir();
  const std::string file = write_file(dir, "tags.toml", kTags);
  const std::string log = dir + "/outrund.log";
  Daemon d({"--tags", file, "--log-file", log, "--log-level", "info"});
  auto c = d.client();
  REQUIRE(!c->update_sources({good("a", outrun::Value(10.0))}));
  auto read_f = [&] {
    std::vector<tags::Change> v;
    REQUIRE(!c->read_tags({"f"}, &v));
    return v.at(0).value;
  };
  auto wait_f = [&](float want) {
    for (int i = 0; i < 500; ++i) {
      auto v = read_f();
      if (v.value.is<float>() && v.value.as<float>() == want) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };
  CHECK(wait_f(20.0f));
  // Changed file: f = a * 3.
  std::string changed = kTags;
  changed.replace(changed.find("inputs.a * 2"), 12, "inputs.a * 3");
  write_file(dir, "tags.toml", changed);
  kill(d.pid, SIGHUP);
  bool reloaded = false;
  for (int i = 0; i < 500 && !reloaded; ++i) {
    std::this_thread::sleep_for(10ms);
    reloaded = read_all(log).find("SIGHUP: tags file " + file +
                                  ": 1 defined or changed, 1 "
                                  "unchanged") != std::string::npos;
  }
  REQUIRE(reloaded);
  REQUIRE(!c->update_sources({good("a", outrun::Value(10.0))}));
  CHECK(wait_f(30.0f));
  // A file that is not TOML: logged with its line, the running tags stay.
  write_file(dir, "tags.toml", "[[tag]\nid = \"f\"\nscript = 7\n");
  kill(d.pid, SIGHUP);
  bool logged = false;
  for (int i = 0; i < 500 && !logged; ++i) {
    std::this_thread::sleep_for(10ms);
    logged = read_all(log).find("the running tags are kept") != std::string::npos;
  }
  REQUIRE(logged);
  CHECK(read_all(log).find("tags.toml:1:") != std::string::npos);
  REQUIRE(!c->update_sources({good("a", outrun::Value(11.0))}));
  CHECK(wait_f(33.0f));
  // One broken tag (a script that is not a string): it gets BadConfigurationError, u runs on.
  std::string one_broken = kTags;
  one_broken.replace(one_broken.find("script = \"return inputs.a * 2\""), 30, "script = 7");
  write_file(dir, "tags.toml", one_broken);
  kill(d.pid, SIGHUP);
  bool isolated = false;
  for (int i = 0; i < 500 && !isolated; ++i) {
    std::this_thread::sleep_for(10ms);
    isolated = read_all(log).find("0 removed, 1 broken") != std::string::npos;
  }
  REQUIRE(isolated);
  CHECK(read_all(log).find("tags.toml:6:10: tag 'f': script: expected a string") !=
        std::string::npos);
  CHECK(read_f().status == tags::codes::BadConfigurationError);
  REQUIRE(!c->update_sources({good("a", outrun::Value(12.0))}));
  for (int i = 0; i < 500; ++i) {
    std::vector<tags::Change> v;
    REQUIRE(!c->read_tags({"u"}, &v));
    if (v[0].value.value == outrun::Value(uint64_t{13})) break;
    std::this_thread::sleep_for(10ms);
  }
  std::vector<tags::Change> uv;
  REQUIRE(!c->read_tags({"u"}, &uv));
  CHECK(uv[0].value.value == outrun::Value(uint64_t{13}));
  CHECK(d.stop() == 0);
  // At start: the same file runs (not strict); strict, or a file that is not TOML, exits 2.
  Daemon d2({"--tags", file});
  CHECK(d2.stop() == 0);
  write_file(dir, "tags.toml", "[[tag]\n");
  const auto [rc, out] =
      run_command(std::string(OUTRUN_TEST_DAEMON) + " --socket " + dir + "/other.sock --worker " +
                  OUTRUN_TEST_WORKER + " --shards 1 --tags " + file + " 2>&1");
  CHECK(rc == 2);
  CHECK(out.find("tags.toml:1:") != std::string::npos);
  std::remove(file.c_str());
  std::remove(log.c_str());
  std::remove((dir + "/other.sock").c_str());
  rmdir(dir.c_str());
}

TEST_CASE(
    "outrund tags: a subscriber that does not read stays bounded and then gets the latest values") {
  Daemon d;
  auto c = d.client();
  constexpr int kTagsN = 10;
  std::string text;
  for (int k = 0; k < kTagsN; ++k)
    text += "[[tag]]\nid = \"v" + std::to_string(k) + "\"\ninputs = [\"s" + std::to_string(k) +
            "\"]\nscript = \"return inputs.s" + std::to_string(k) + "\"\n";
  REQUIRE(!c->define_tags(text, false));

  // The subscriber's reader blocks in its first callback: it reads nothing while updates flow.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::map<std::string, double> latest;
  std::atomic<std::size_t> received{0};
  auto sub = d.client();  // after what its callback uses: destroyed (reader joined) first
  REQUIRE(!sub->subscribe({}, [&](const std::vector<tags::Change>& ch) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
    for (const auto& x : ch)
      if (x.value.value.is<double>()) latest[x.tag] = x.value.value.as<double>();
    received += ch.size();
    cv.notify_all();
  }));
  const long rss0 = rss_kb(d.pid);
  // 100,000 updates: 10,000 waves of 10, a payload that makes each change ~1 KiB.
  for (int w = 0; w < 10000; ++w) {
    std::vector<tags::SourceUpdate> ups;
    for (int k = 0; k < kTagsN; ++k)
      ups.push_back(good("s" + std::to_string(k), outrun::Value(w + k * 0.001)));
    REQUIRE(!c->update_sources(ups));
  }
  std::vector<tags::SourceUpdate> last;
  for (int k = 0; k < kTagsN; ++k)
    last.push_back(good("s" + std::to_string(k), outrun::Value(1e6 + k)));
  REQUIRE(!c->update_sources(last));
  for (int i = 0; i < 1000; ++i) {  // the last wave evaluated
    std::vector<tags::Change> v;
    REQUIRE(!c->read_tags({"v9"}, &v));
    if (v[0].value.value == outrun::Value(1e6 + 9)) break;
    std::this_thread::sleep_for(10ms);
  }
  const long rss1 = rss_kb(d.pid);
  MESSAGE("daemon RSS before " << rss0 << " kB, after 100,000 updates " << rss1 << " kB");
  // ASan's quarantine keeps freed memory resident (125 MB here), so the bound is checked
  // without sanitizers only; what the subscriber receives is checked in every build.
  if (!outrun::test::kSanitized) CHECK(rss1 - rss0 < 64 * 1024);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  std::unique_lock lock(mu);
  const bool all = cv.wait_for(lock, 20s, [&] {
    for (int k = 0; k < kTagsN; ++k) {
      auto it = latest.find("v" + std::to_string(k));
      if (it == latest.end() || it->second != 1e6 + k) return false;
    }
    return true;
  });
  CHECK(all);
  MESSAGE("the subscriber received " << received.load() << " changes");
  CHECK(received.load() < 100000);  // the latest values only, once over the budget
}

TEST_CASE("outrund tags: malformed or wrong-direction tags frames disconnect only the sender") {
  Daemon d;
  Collector col;
  auto c = d.client();
  REQUIRE(!c->define_tags(kTags, false));
  REQUIRE(!c->subscribe({"f"}, std::ref(col)));
  auto hello = [](flatbuffers::FlatBufferBuilder& f) {
    outrun::protocol::encode_client_hello(f, "t");
  };
  // A client sending TagChanges (daemon -> client only).
  {
    const int fd = connect_raw(d.socket);
    flatbuffers::FlatBufferBuilder f;
    hello(f);
    send_frame(fd, f);
    f.Clear();
    auto tv = wire::CreateTagValue(f, f.CreateString("f"));
    outrun::protocol::encode_tag_changes(f, {&tv, 1});
    send_frame(fd, f);
    CHECK(closed_by_peer(fd));
    close(fd);
  }
  // A TagValue without its required tag (fails verification).
  {
    const int fd = connect_raw(d.socket);
    flatbuffers::FlatBufferBuilder f;
    hello(f);
    send_frame(fd, f);
    f.Clear();
    // Built by hand: TagValueBuilder::Finish asserts the required field in debug builds.
    const auto start = f.StartTable();
    const flatbuffers::Offset<wire::TagValue> tv(f.EndTable(start));
    outrun::protocol::encode_source_updates(f, 1, 0, {&tv, 1});
    send_frame(fd, f);
    CHECK(closed_by_peer(fd));
    close(fd);
  }
  // Too many ids: refused, the connection stays.
  std::vector<std::string> many(5000, "x");
  std::vector<tags::Change> v;
  CHECK(c->read_tags(many, &v).code == outrun::ErrorCode::invalid_argument);  // checked locally
  // The others go on.
  REQUIRE(!c->update_sources({good("a", outrun::Value(2.0))}));
  CHECK(col.wait([](auto& m) { return m.count("f") > 0; }));
  CHECK(c->connected());
}

TEST_CASE("outrund tags: outrun tags define, update, read, list and watch through the CLI") {
  Daemon d;
  const std::string dir = temp_dir();
  const std::string file = write_file(dir, "t.toml", kTags);
  const std::string ups = write_file(dir, "u.jsonl", "{\"values\": {\"a\": 4}}\n");
  const std::string cli = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket + " tags ";
  // A watcher as a process.
  const std::string watch_out = dir + "/watch.out";
  const pid_t w = fork();
  REQUIRE(w >= 0);
  if (w == 0) {
    const int o = open(watch_out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    execl(OUTRUN_TEST_CLI, OUTRUN_TEST_CLI, "--socket", d.socket.c_str(), "tags", "watch", "f",
          nullptr);
    _exit(127);
  }
  int rc = 0;
  std::string out;  // not a structured binding: CHECK_MESSAGE captures it (clang 14)
  std::tie(rc, out) = run_command(cli + "define -f " + file);
  CHECK(rc == 0);
  CHECK_MESSAGE(out.find("defined or changed: 2  f, u\n") != std::string::npos, out);
  std::tie(rc, out) = run_command(cli + "define --json -f " + file);
  CHECK(rc == 0);
  CHECK(out.find("\"unchanged\":[\"f\",\"u\"]") != std::string::npos);
  std::this_thread::sleep_for(300ms);  // the watcher subscribed
  std::tie(rc, out) = run_command(cli + "update -f " + ups);
  CHECK(rc == 0);
  std::string got;
  for (int i = 0; i < 500 && got.find("\"tag\":\"f\"") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
    got = read_all(watch_out);
  }
  CHECK(got.find("\"tag\":\"f\"") != std::string::npos);
  CHECK(got.find("\"value\":8") != std::string::npos);
  kill(w, SIGINT);
  int st = 0;
  waitpid(w, &st, 0);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  std::tie(rc, out) = run_command(cli + "read --json u");
  CHECK(rc == 0);
  CHECK(out.find("\"value\":5") != std::string::npos);
  std::tie(rc, out) = run_command(cli + "list");
  CHECK(rc == 0);
  CHECK(out.find("f  Good  8") != std::string::npos);
  CHECK(out.find("evaluations=") != std::string::npos);
  // An unknown tag among known ones: the known are answered, the unknown is BadNodeIdUnknown.
  std::tie(rc, out) = run_command(cli + "read u nope f");
  CHECK(rc == 1);
  CHECK_MESSAGE(out.find("u = 5  Good") != std::string::npos, out);
  CHECK_MESSAGE(out.find("nope = nil  BadNodeIdUnknown") != std::string::npos, out);
  CHECK_MESSAGE(out.find("f = 8.0  Good") != std::string::npos, out);
  std::tie(rc, out) = run_command(cli + "remove f");
  CHECK(rc == 0);
  std::tie(rc, out) = run_command(cli + "read --json f");
  CHECK(rc == 1);
  CHECK_MESSAGE(out.find("\"status\":\"BadNodeIdUnknown\"") != std::string::npos, out);
  CHECK_MESSAGE(out.find("\"source_time\":null") != std::string::npos, out);  // never set
  CHECK(out.find("1601") == std::string::npos);
  const std::string bad = write_file(dir, "bad.jsonl", "{\"values\": {\"a\": 1}}\n{nope\n");
  std::tie(rc, out) = run_command(cli + "update -f " + bad + " 2>&1");
  CHECK(rc == 2);
  CHECK(out.find("bad.jsonl:2:") != std::string::npos);
  for (const auto& p : {file, ups, bad, watch_out}) std::remove(p.c_str());
  rmdir(dir.c_str());
}

TEST_CASE("outrund tags: a SourceUpdates whose entries share one diagnostics string is refused") {
  // 60,000 entries, each the same TagValue with 60 KB of diagnostics: 3.6 GB of copies from a
  // small frame. Refused at the frame's decode budget (ids and diagnostics count at each use).
  Daemon d;
  const int fd = connect_raw(d.socket);
  flatbuffers::FlatBufferBuilder f;
  outrun::protocol::encode_client_hello(f, "t");
  send_frame(fd, f);
  f.Clear();
  const auto dv = wire::CreateDataValue(f, 0, 0, 0, 0, f.CreateString(std::string(60000, 'd')));
  const auto tv = wire::CreateTagValue(f, f.CreateString("a"), dv);
  const std::vector<flatbuffers::Offset<wire::TagValue>> entries(60000, tv);
  outrun::protocol::encode_source_updates(f, 5, 0, entries);
  send_frame(fd, f);
  outrun::protocol::FrameReader reader;
  std::string error;
  bool answered = false;
  while (!answered) {
    REQUIRE(reader.read_from(fd) > 0);
    outrun::protocol::FrameView fv;
    while (reader.next(fv)) {
      if (fv.frame->body_type() != wire::Body::TagsReply) continue;
      const auto* r = fv.frame->body_as_TagsReply();
      if (r->request_id() != 5) continue;
      answered = true;
      CHECK(r->status() == wire::Status::InvalidArgument);
      if (r->error()) error = r->error()->str();
    }
  }
  CHECK(error.find("decode to too much") != std::string::npos);
  close(fd);
}

TEST_CASE("outrund tags: a client's clock is a source timestamp, never the server's time") {
  Daemon d;
  auto c = d.client();
  REQUIRE(
      !c->define_tags("[[tag]]\nid = \"n\"\ninputs = [\"a\"]\nscript = \"return now\"\n"
                      "[[tag]]\nid = \"s\"\ninputs = [\"b\"]\nscript = \"return now\"\n",
                      false));
  const auto wall = [] {
    return outrun::DateTime::from_unix_micros(
        std::chrono::duration_cast<std::chrono::microseconds>(
            std::chrono::system_clock::now().time_since_epoch())
            .count());
  };
  const outrun::DateTime y2099 = outrun::DateTime::from_unix_seconds(4070908800.0);  // 2099-01-01
  const outrun::DateTime before = wall();
  // A wave time of 2099 from the client (the request's `time`) and a source timestamp of 2099.
  tags::SourceUpdate stamped = good("b", outrun::Value(1.0));
  stamped.value.source_time = y2099;
  REQUIRE(!c->update_sources({good("a", outrun::Value(1.0))}, y2099));
  REQUIRE(!c->update_sources({stamped}));
  std::vector<tags::Change> v;
  for (int i = 0; i < 500; ++i) {
    REQUIRE(!c->read_tags({"n", "s", "a", "b"}, &v));
    if (v[0].value.status == tags::codes::Good && v[1].value.status == tags::codes::Good) break;
    std::this_thread::sleep_for(10ms);
  }
  const outrun::DateTime after = wall();
  for (int i = 0; i < 2; ++i) {
    CAPTURE(v[i].tag);
    CHECK(v[i].value.status == tags::codes::Good);
    // The server timestamp and the script's `now` are outrund's clock...
    CHECK(v[i].value.server_time >= before);
    CHECK(v[i].value.server_time <= after);
    CHECK(v[i].value.value.as<double>() <= after.unix_seconds());
    CHECK(v[i].value.value.as<double>() >= before.unix_seconds() - 1);
    // ...and the source timestamp is what the writer said (newest_input).
    CHECK(v[i].value.source_time == y2099);
  }
  CHECK(v[2].value.source_time == y2099);  // the request's time: the updates' source timestamp
  CHECK(v[2].value.server_time <= after);
  CHECK(v[3].value.server_time <= after);
}

namespace {

// The answer to request `rid` on a raw connection (a TagsReply or TagValues): {status, error};
// {Nil status, "closed"} when the daemon closed the connection first.
struct RawAnswer {
  wire::Body body = wire::Body::NONE;
  wire::Status status = wire::Status::Ok;
  std::string error;
  bool closed = false;
};

RawAnswer answer_to(int fd, outrun::protocol::FrameReader& reader, uint64_t rid) {
  for (;;) {
    outrun::protocol::FrameView fv;
    while (reader.next(fv)) {
      RawAnswer a;
      a.body = fv.frame->body_type();
      if (const auto* r = fv.frame->body_as_TagsReply(); r && r->request_id() == rid) {
        a.status = r->status();
        if (r->error()) a.error = r->error()->str();
        return a;
      }
      if (const auto* r = fv.frame->body_as_TagValues(); r && r->request_id() == rid) {
        a.status = r->status();
        if (r->error()) a.error = r->error()->str();
        return a;
      }
    }
    if (reader.read_from(fd) <= 0) {
      RawAnswer a;
      a.closed = true;
      return a;
    }
  }
}

flatbuffers::Offset<wire::TagValue> raw_entry(flatbuffers::FlatBufferBuilder& f,
                                              const std::string& tag,
                                              flatbuffers::Offset<wire::Value> v = 0,
                                              const std::string& diagnostics = {}) {
  const auto d = diagnostics.empty() ? 0 : f.CreateString(diagnostics);
  const auto dv = wire::CreateDataValue(f, v, 0, 0, 0, d);
  return wire::CreateTagValue(f, f.CreateString(tag), dv);
}

}  // namespace

// A frame that is valid (length, verification) but whose content outrund does not take: each is
// answered InvalidArgument for that request, and the connection serves the next one
// (design/protocol.md "Tags frames"). Only a frame that is itself malformed closes it (above).
TEST_CASE("outrund tags: valid frames with invalid content are answered, the connection kept") {
  Daemon d;
  REQUIRE(!d.client()->define_tags(kTags, false));
  const int fd = connect_raw(d.socket);
  flatbuffers::FlatBufferBuilder f;
  outrun::protocol::encode_client_hello(f, "t");
  send_frame(fd, f);
  outrun::protocol::FrameReader reader;
  uint64_t rid = 100;
  // Sends the frame built by `build(f, rid)` and expects InvalidArgument with `what` in it.
  auto refused = [&](const std::string& name, const std::string& what, auto&& build) {
    INFO(name);
    f.Clear();
    build(f, ++rid);
    REQUIRE(f.GetSize() <= outrun::protocol::kMaxFrameSize + 4);
    send_frame(fd, f);
    const RawAnswer a = answer_to(fd, reader, rid);
    REQUIRE_FALSE(a.closed);
    CHECK(a.status == wire::Status::InvalidArgument);
    CHECK_MESSAGE(a.error.find(what) != std::string::npos, a.error);
  };
  using Fbb = flatbuffers::FlatBufferBuilder;
  const std::string long_id(300, 'i');
  refused("SourceUpdates: an id over 256 bytes", "1..256 bytes", [&](Fbb& b, uint64_t id) {
    auto e = raw_entry(b, long_id);
    outrun::protocol::encode_source_updates(b, id, 0, {&e, 1});
  });
  refused("SourceUpdates: an empty id", "1..256 bytes", [&](Fbb& b, uint64_t id) {
    auto e = raw_entry(b, "");
    outrun::protocol::encode_source_updates(b, id, 0, {&e, 1});
  });
  refused("SourceUpdates: too many updates", "65536 updates", [&](Fbb& b, uint64_t id) {
    auto e = raw_entry(b, "a");
    const std::vector<flatbuffers::Offset<wire::TagValue>> many(65537, e);
    outrun::protocol::encode_source_updates(b, id, 0, many);
  });
  refused("SourceUpdates: diagnostics over 64 KiB", "64 KiB", [&](Fbb& b, uint64_t id) {
    auto e = raw_entry(b, "a", 0, std::string(65537, 'd'));
    outrun::protocol::encode_source_updates(b, id, 0, {&e, 1});
  });
  refused("SourceUpdates: a value of an unknown kind", "not a valid value",
          [&](Fbb& b, uint64_t id) {
            wire::ValueBuilder vb(b);
            vb.add_kind(static_cast<wire::ValueKind>(200));
            auto v = vb.Finish();
            auto e = raw_entry(b, "a", v);
            outrun::protocol::encode_source_updates(b, id, 0, {&e, 1});
          });
  refused("SourceUpdates: a value nested 40 deep", "not a valid value", [&](Fbb& b, uint64_t id) {
    auto v = wire::CreateValue(b, wire::ValueKind::Nil);
    for (int i = 0; i < 40; ++i) {
      std::vector<flatbuffers::Offset<wire::Value>> one{v};
      v = wire::CreateValue(b, wire::ValueKind::Array, false, 0, 0, 0, 0, b.CreateVector(one));
    }
    auto e = raw_entry(b, "a", v);
    outrun::protocol::encode_source_updates(b, id, 0, {&e, 1});
  });
  refused("SourceUpdates: a virtual tag", "virtual tag", [&](Fbb& b, uint64_t id) {
    auto e = raw_entry(b, "f", wire::CreateValue(b, wire::ValueKind::Double, false, 0, 1.0));
    outrun::protocol::encode_source_updates(b, id, 0, {&e, 1});
  });
  const std::vector<std::string> too_many(4097, "a");
  const std::vector<std::string> too_long{long_id};
  refused("ReadTags: too many ids", "4096 ids",
          [&](Fbb& b, uint64_t id) { outrun::protocol::encode_read_tags(b, id, too_many); });
  refused("ReadTags: an id over 256 bytes", "1..256 bytes",
          [&](Fbb& b, uint64_t id) { outrun::protocol::encode_read_tags(b, id, too_long); });
  refused("ReadTags: an unknown id", "unknown tag", [&](Fbb& b, uint64_t id) {
    const std::vector<std::string> ids{"nope"};
    outrun::protocol::encode_read_tags(b, id, ids);
  });
  refused("Subscribe: too many ids", "4096 ids",
          [&](Fbb& b, uint64_t id) { outrun::protocol::encode_subscribe(b, id, too_many, false); });
  refused("Subscribe: an id over 256 bytes", "1..256 bytes",
          [&](Fbb& b, uint64_t id) { outrun::protocol::encode_subscribe(b, id, too_long, false); });
  refused("RemoveTags: too many ids", "4096 ids",
          [&](Fbb& b, uint64_t id) { outrun::protocol::encode_remove_tags(b, id, too_many); });
  refused("RemoveTags: an id over 256 bytes", "1..256 bytes",
          [&](Fbb& b, uint64_t id) { outrun::protocol::encode_remove_tags(b, id, too_long); });
  refused("DefineTags: no text", "needs toml", [&](Fbb& b, uint64_t id) {
    outrun::protocol::finish_frame(b, wire::Body::DefineTags,
                                   wire::CreateDefineTags(b, id).Union());
  });
  // A fire-and-forget update (request_id 0) that is refused is answered with request_id 0.
  {
    f.Clear();
    auto e = raw_entry(f, long_id);
    outrun::protocol::encode_source_updates(f, 0, 0, {&e, 1});
    send_frame(fd, f);
    const RawAnswer a = answer_to(fd, reader, 0);
    REQUIRE_FALSE(a.closed);
    CHECK(a.status == wire::Status::InvalidArgument);
  }
  // The connection still serves: an update, then a read of what it computed.
  f.Clear();
  auto e = raw_entry(f, "a", wire::CreateValue(f, wire::ValueKind::Double, false, 0, 3.0));
  outrun::protocol::encode_source_updates(f, ++rid, 0, {&e, 1});
  send_frame(fd, f);
  RawAnswer a = answer_to(fd, reader, rid);
  REQUIRE_FALSE(a.closed);
  CHECK(a.status == wire::Status::Ok);
  bool six = false;
  for (int i = 0; i < 500 && !six; ++i) {
    f.Clear();
    const std::vector<std::string> ids{"f"};
    outrun::protocol::encode_read_tags(f, ++rid, ids);
    send_frame(fd, f);
    outrun::protocol::FrameView fv;
    for (;;) {
      if (reader.next(fv)) {
        const auto* tv = fv.frame->body_as_TagValues();
        if (!tv || tv->request_id() != rid) continue;
        REQUIRE(tv->status() == wire::Status::Ok);
        REQUIRE(tv->values());
        REQUIRE(tv->values()->size() == 1);
        const auto* dv = tv->values()->Get(0)->value();
        six = dv && dv->value() && dv->value()->double_value() == 6.0;
        break;
      }
      REQUIRE(reader.read_from(fd) > 0);
    }
    if (!six) std::this_thread::sleep_for(10ms);
  }
  CHECK(six);
  close(fd);
  CHECK(d.stats()["client_protocol_violations"] == 0);
}

// outrun::Client refuses a request larger than a frame before sending it: invalid_argument
// naming the limit, and the same client goes on (the daemon never sees an oversized frame).
TEST_CASE("outrund tags: outrun::Client refuses updates and texts larger than a frame") {
  Daemon d;
  auto c = d.client();
  REQUIRE(!c->define_tags(kTags, false));
  const std::string big(20u << 20, 'x');  // 20 MiB
  const std::string limit = std::to_string(outrun::protocol::kMaxFrameSize);
  outrun::Error e = c->update_sources({good("a", outrun::Value(big))});
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find(limit) != std::string::npos, e.message);
  // Four of 5 MiB: each fits, the wave does not.
  const std::string five(5u << 20, 'y');
  e = c->update_sources({good("s1", outrun::Value(five)), good("s2", outrun::Value(five)),
                         good("s3", outrun::Value(five)), good("s4", outrun::Value(five))});
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find(limit) != std::string::npos, e.message);
  e = c->define_tags("# " + big + "\n", false);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find(limit) != std::string::npos, e.message);
  // 65,536 updates (the most a wave takes) of 230-byte ids: 15 MB of ids, a frame over 16 MiB
  // with its tables. Refused by the encoded size, which names the body.
  std::vector<tags::SourceUpdate> wide;
  for (int i = 0; i < 65536; ++i) {
    std::string id = "s" + std::to_string(i);
    id.resize(230, '_');
    wide.push_back(good(id, outrun::Value(int64_t{i})));
  }
  e = c->update_sources(wide);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("SourceUpdates frame would be") != std::string::npos, e.message);
  CHECK_MESSAGE(e.message.find(limit) != std::string::npos, e.message);
  e = c->update_sources({good(std::string(300, 'i'), outrun::Value(1.0))});
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK_MESSAGE(e.message.find("1..256 bytes") != std::string::npos, e.message);
  // The same connection goes on, and a value that fits still goes through.
  CHECK(c->connected());
  REQUIRE(!c->update_sources({good("a", outrun::Value(2.0))}));
  // (under max_tag_source_value_bytes, 1 MiB: design/daemon.md "Tags bounds")
  REQUIRE(!c->update_sources({good("big", outrun::Value(std::string(512u << 10, 'b')))}));
  bool four = false;
  for (int i = 0; i < 500 && !four; ++i) {
    std::vector<tags::Change> v;
    REQUIRE(!c->read_tags({"f"}, &v));
    four = v.size() == 1 && v[0].value.value == outrun::Value(4.0f);
    if (!four) std::this_thread::sleep_for(10ms);
  }
  CHECK(four);
  std::string stats;
  REQUIRE(!c->stats_json(&stats));
  CHECK(nlohmann::json::parse(stats)["client_protocol_violations"] == 0);
}

TEST_CASE("outrund tags: [[source]] and [[alarm]] declarations are served by ListTags") {
  const std::string dir = temp_dir();
  const std::string decls = R"(
[[source]]
id = "a"
type = "Boolean"

[[alarm]]
id = "f.Limits"
tag = "f"
high = 10
)";
  const std::string file = write_file(dir, "tags.toml", std::string(kTags) + decls);
  const std::string log = dir + "/outrund.log";
  Daemon d({"--tags", file, "--log-file", log, "--log-level", "info"});
  auto c = d.client();
  auto listed = [&] {
    std::string json;
    REQUIRE(!c->list_tags_json(&json));
    const auto j = nlohmann::ordered_json::parse(json);
    return std::pair{j.at("sources").dump(), j.at("alarms").dump()};
  };
  CHECK(listed().first == R"([{"id":"a","type":"Boolean","writable":true}])");
  CHECK(
      listed().second ==
      R"([{"id":"f.Limits","tag":"f","kind":"limit","high":10.0,"severity":500,"max_shelved_ms":3600000}])");
  // DefineTags that is not replace_all: merged by id.
  REQUIRE(
      !c->define_tags(std::string(kTags) + "[[source]]\nid = \"a\"\ntype = \"Float\"\n", false));
  CHECK(listed().first == R"([{"id":"a","type":"Float","writable":true}])");
  CHECK(listed().second.find("f.Limits") != std::string::npos);
  // A bad declaration is an error of the text as a whole: nothing changes.
  outrun::Error e =
      c->define_tags(std::string(kTags) + "[[source]]\nid = \"a\"\ntype = \"Nope\"\n", true);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK(e.message.find("unknown DataType 'Nope'") != std::string::npos);
  CHECK(listed().first == R"([{"id":"a","type":"Float","writable":true}])");
  // A reload replaces them with the file's.
  write_file(dir, "tags.toml", kTags);
  kill(d.pid, SIGHUP);
  bool reloaded = false;
  for (int i = 0; i < 500 && !reloaded; ++i) {
    std::this_thread::sleep_for(10ms);
    reloaded = listed().second == "[]";
  }
  CHECK(reloaded);
  CHECK(listed().first == "[]");
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund tags: tag evaluations count in stats and metrics, timeouts included") {
  Daemon d({"--timeout", "50", "--grace", "50"});
  auto c = d.client();
  REQUIRE(
      !c->define_tags("[[tag]]\nid = \"ok\"\ninputs = [\"a\"]\nscript = \"return inputs.a\"\n"
                      "[[tag]]\nid = \"spin\"\ninputs = [\"b\"]\n"
                      "script = \"while true do end\"\n",
                      false));
  REQUIRE(!c->update_sources({good("a", outrun::Value(1.0)), good("b", outrun::Value(1.0))}));
  nlohmann::json j;
  for (int i = 0; i < 500; ++i) {
    std::string doc;
    REQUIRE(!c->stats_json(&doc));
    j = nlohmann::json::parse(doc);
    if (j["tags"]["by_status"]["timeout"].get<uint64_t>() >= 1 &&
        j["tags"]["by_status"]["ok"].get<uint64_t>() >= 1)
      break;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(j["tags"]["tags"] == 2);
  CHECK(j["tags"]["waves"].get<uint64_t>() >= 1);
  CHECK(j["tags"]["by_status"]["timeout"].get<uint64_t>() >= 1);
  CHECK(j["tags"]["by_status"]["ok"].get<uint64_t>() >= 1);
  // Where an alert on timeouts looks: the daemon's evaluations by status.
  CHECK(j["evaluations"]["timeout"].get<uint64_t>() >= 1);
  const std::string cli = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket + " ";
  int rc = 0;
  std::string out;  // not a structured binding: CHECK_MESSAGE captures it (clang 14)
  std::tie(rc, out) = run_command(cli + "stats --prometheus");
  CHECK(rc == 0);
  CHECK_MESSAGE(out.find("outrun_tag_evaluations_total{status=\"timeout\"} ") != std::string::npos,
                out);
  CHECK(out.find("outrun_evaluations_total{status=\"timeout\"} 0\n") == std::string::npos);
  CHECK(out.find("outrun_tag_waves_total ") != std::string::npos);
  std::tie(rc, out) = run_command(cli + "tags list");
  CHECK(rc == 0);
  CHECK_MESSAGE(out.find("timeout=") != std::string::npos, out);
}

TEST_CASE("outrund tags: metrics_per_tag_series gives per-tag series for at most N tags") {
  const std::string dir = temp_dir();
  const std::string conf =
      write_file(dir, "outrund.toml", "[daemon]\nmetrics_per_tag_series = 2\n");
  Daemon d({"--config", conf});
  auto c = d.client();
  // The first id has a quote and a backslash: escaped in the label value.
  REQUIRE(
      !c->define_tags("[[tag]]\nid = 'w\"q\\x'\ninputs = [\"a\"]\nscript = \"return inputs.a\"\n"
                      "[[tag]]\nid = \"t2\"\ninputs = [\"a\"]\nscript = \"return inputs.a + 1\"\n"
                      "[[tag]]\nid = \"t3\"\ninputs = [\"a\"]\nscript = \"return inputs.a + 2\"\n",
                      false));
  REQUIRE(!c->update_sources({good("a", outrun::Value(1.0))}));
  nlohmann::json j;
  for (int i = 0; i < 500; ++i) {
    std::string doc;
    REQUIRE(!c->stats_json(&doc));
    j = nlohmann::json::parse(doc);
    if (j["tags"]["by_status"]["ok"].get<uint64_t>() >= 3) break;
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(j["tags"].contains("per_tag"));
  CHECK(j["tags"]["per_tag"].size() == 2);
  CHECK(j["tags"]["per_tag_omitted"] == 1);
  const std::string cli = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket + " ";
  int rc = 0;
  std::string out;  // not a structured binding: CHECK_MESSAGE captures it
  std::tie(rc, out) = run_command(cli + "stats --prometheus");
  CHECK(rc == 0);
  CHECK_MESSAGE(
      out.find("outrun_tag_evaluations_by_tag_total{tag=\"w\\\"q\\\\x\",status=\"ok\"} 1\n") !=
          std::string::npos,
      out);
  CHECK_MESSAGE(out.find("outrun_tag_last_duration_seconds{tag=\"t2\"} ") != std::string::npos,
                out);
  CHECK(out.find("tag=\"t3\"") == std::string::npos);
  CHECK_MESSAGE(out.find("outrun_tag_series_omitted 1\n") != std::string::npos, out);
  std::size_t series = 0;
  for (std::size_t at = 0;
       (at = out.find("outrun_tag_last_duration_seconds{", at)) != std::string::npos; ++at)
    ++series;
  CHECK(series == 2);
}

TEST_CASE("outrund tags: without metrics_per_tag_series there are no per-tag series") {
  Daemon d;
  auto c = d.client();
  REQUIRE(!c->define_tags("[[tag]]\nid = \"x\"\ninputs = [\"a\"]\nscript = \"return inputs.a\"\n",
                          false));
  std::string doc;
  REQUIRE(!c->stats_json(&doc));
  CHECK(!nlohmann::json::parse(doc)["tags"].contains("per_tag"));
  int rc = 0;
  std::string out;
  std::tie(rc, out) =
      run_command(std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket + " stats --prometheus");
  CHECK(rc == 0);
  CHECK(out.find("tag=\"") == std::string::npos);
  CHECK(out.find("outrun_tag_series_omitted") == std::string::npos);
}
