// Script logs through outrund (design/daemon.md "Script logs"): what scripts print or log
// reaches the evaluation's Result, the script's ring (`outrun logs KEY`), a tag's ring
// (`outrun tags log ID`) and a failed tag's diagnostics; a script that logs in a loop costs only
// itself; only a key's owner or an admin reads its lines.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "daemon_support.h"
#include "outrun/protocol/script_log.h"
#include "outrun/tags.h"

namespace {

using namespace std::chrono_literals;
using namespace outrun::test;
namespace tags = outrun::tags;

tags::SourceUpdate source(const std::string& tag, outrun::Value v) {
  tags::SourceUpdate u;
  u.tag = tag;
  u.value.value = std::move(v);
  u.value.status = tags::codes::Good;
  return u;
}

std::string write_temp(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// The tag's ring, once it has at least `n` lines (evaluations complete asynchronously).
outrun::LogPage tag_page(outrun::Client& c, const std::string& id, std::size_t n) {
  outrun::LogPage page;
  for (int i = 0; i < 500; ++i) {
    REQUIRE(!c.tag_logs(id, 0, &page));
    if (page.lines.size() >= n) break;
    std::this_thread::sleep_for(10ms);
  }
  return page;
}

}  // namespace

TEST_CASE("outrund script logs: lines come with the result and stay in the script's ring") {
  Daemon d;
  auto c = d.client();
  outrun::Script s;
  REQUIRE(!c->register_script("logger", "print('n =', inputs.n) log.warn('careful') return 1", &s));
  for (int n = 1; n <= 3; ++n) {
    const outrun::Result r = c->evaluate(s, {{"n", outrun::Value(int64_t{n})}}).get();
    REQUIRE(r.status == outrun::Status::ok);
    REQUIRE(r.logs.size() == 2);
    CHECK(r.logs[0].level == outrun::LogLevel::info);
    CHECK(r.logs[0].text == "n = " + std::to_string(n));
    CHECK(r.logs[1].level == outrun::LogLevel::warn);
    CHECK(r.logs[1].text == "careful");
  }
  outrun::LogPage page;
  REQUIRE(!c->script_logs("logger", 0, &page));
  REQUIRE(page.lines.size() == 6);
  CHECK(page.lines[0].seq == 1);
  CHECK(page.lines[0].text == "n = 1");
  CHECK(page.lines[5].seq == 6);
  CHECK(page.lines[5].level == outrun::LogLevel::warn);
  CHECK(page.next == 7);
  CHECK(page.missed == 0);
  CHECK(page.lines[0].unix_us > 0);
  // A follower's next read: only what is new.
  REQUIRE(!c->script_logs("logger", page.next, &page));
  CHECK(page.lines.empty());
  CHECK(page.next == 7);
  // A script that never logged has an empty ring; an unknown key is an error.
  outrun::Script quiet;
  REQUIRE(!c->register_script("quiet", "return 2", &quiet));
  CHECK(c->evaluate(quiet, {}).get().logs.empty());
  REQUIRE(!c->script_logs("quiet", 0, &page));
  CHECK(page.lines.empty());
  const outrun::Error e = c->script_logs("nope", 0, &page);
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK(e.message.find("no script is registered under 'nope'") != std::string::npos);
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund script logs: a script that logs in a loop costs itself, not its neighbours") {
  Daemon d;
  auto c = d.client();
  outrun::Script noisy, calm;
  REQUIRE(
      !c->register_script("noisy", "for i = 1, 100000 do print('spam', i) end return 1", &noisy));
  REQUIRE(!c->register_script("calm", "log.info('calm', inputs.n) return inputs.n", &calm));
  uint64_t dropped = 0;
  for (int i = 0; i < 20; ++i) {
    const outrun::Result r = c->evaluate(noisy, {}).get();
    REQUIRE(r.status == outrun::Status::ok);
    CHECK(r.logs.size() <= outrun::protocol::kMaxLogLinesPerEvaluation);
    dropped += r.logs_dropped;
    const outrun::Result q = c->evaluate(calm, {{"n", outrun::Value(int64_t{i})}}).get();
    REQUIRE(q.status == outrun::Status::ok);
    REQUIRE(q.logs.size() == 1);
    CHECK(q.logs_dropped == 0);
  }
  CHECK(dropped >= 20 * (100000 - outrun::protocol::kMaxLogLinesPerEvaluation));
  outrun::LogPage page;
  REQUIRE(!c->script_logs("noisy", 0, &page));
  CHECK(page.lines.size() <= 64);  // the ring keeps its last 64
  CHECK(page.dropped >= dropped);
  REQUIRE(!c->script_logs("calm", 0, &page));
  CHECK(page.lines.size() == 20);  // untouched by its noisy neighbour
  CHECK(page.dropped == 0);
  // From a line the ring no longer has: the gap is reported.
  REQUIRE(!c->script_logs("noisy", 1, &page));
  CHECK(page.missed > 0);
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund script logs: a tag's lines go to its ring and a failure's to its diagnostics") {
  Daemon d;
  auto c = d.client();
  REQUIRE(!c->define_tags(R"toml(
[[tag]]
id = "double"
type = "Double"
inputs = ["a"]
script = "log.debug('a is', inputs.a) return inputs.a * 2"

[[tag]]
id = "fails"
type = "Double"
inputs = ["a"]
script = "log.warn('checking', inputs.a) print('step 2') error('no good')"
)toml",
                          false));
  REQUIRE(!c->update_sources({source("a", outrun::Value(21.0))}));
  outrun::LogPage page = tag_page(*c, "double", 1);
  REQUIRE(page.lines.size() == 1);
  CHECK(page.lines[0].level == outrun::LogLevel::debug);
  CHECK(page.lines[0].text == "a is 21.0");
  page = tag_page(*c, "fails", 2);
  REQUIRE(page.lines.size() == 2);
  CHECK(page.lines[1].text == "step 2");
  std::vector<tags::Change> values;
  REQUIRE(!c->read_tags({"fails"}, &values));
  REQUIRE(values.size() == 1);
  const std::string diag = values[0].value.diagnostics;
  CHECK_MESSAGE(diag.find("no good") != std::string::npos, diag);
  CHECK_MESSAGE(
      diag.find("last log lines: [warn] checking 21.0 | [info] step 2") != std::string::npos, diag);
  const outrun::Error e = c->tag_logs("a", 0, &page);  // a source has no script
  CHECK(e.code == outrun::ErrorCode::invalid_argument);
  CHECK(d.stop() == 0);
}

TEST_CASE("outrund script logs: outrun logs, outrun tags log and outrun eval print the lines") {
  const std::string dir = temp_dir();
  const std::string log_file = dir + "/outrund.log";
  Daemon d({"--log-level", "debug", "--log-file", log_file});
  auto c = d.client();
  outrun::Script s;
  REQUIRE(!c->register_script("cli.logger", "log.error('bad', 'news\\n') return 1", &s));
  REQUIRE(c->evaluate(s, {}).get().status == outrun::Status::ok);
  const std::string cli = std::string(OUTRUN_TEST_CLI) + " --socket " + d.socket + " ";
  int rc = 0;
  std::string out;
  std::tie(rc, out) = run_command(cli + "logs cli.logger");
  CHECK_MESSAGE(rc == 0, out);
  CHECK_MESSAGE(out.find("Z error bad news\\n\n") != std::string::npos, out);
  std::tie(rc, out) = run_command(cli + "logs cli.logger --json");
  CHECK_MESSAGE(out.find("\"level\":\"error\"") != std::string::npos, out);
  CHECK_MESSAGE(out.find("\"seq\":1") != std::string::npos, out);
  std::tie(rc, out) = run_command(cli + "logs nope 2>&1");
  CHECK(rc == 1);
  CHECK_MESSAGE(out.find("no script is registered under 'nope'") != std::string::npos, out);
  // --follow prints what comes later, once.
  const std::string follow_out = dir + "/follow.out";
  const pid_t follower = fork();
  REQUIRE(follower >= 0);
  if (follower == 0) {
    execl("/bin/sh", "sh", "-c",
          ("exec " + cli + "logs cli.logger --follow > " + follow_out).c_str(), nullptr);
    _exit(127);
  }
  std::this_thread::sleep_for(500ms);
  REQUIRE(c->evaluate(s, {}).get().status == outrun::Status::ok);
  const auto count_of = [](const std::string& text) {
    std::size_t n = 0;
    for (std::size_t p = text.find("bad news"); p != std::string::npos;
         p = text.find("bad news", p + 1))
      ++n;
    return n;
  };
  std::string followed;
  for (int i = 0; i < 200 && count_of(followed) < 2; ++i) {
    std::this_thread::sleep_for(20ms);
    std::ifstream in(follow_out);
    std::stringstream ss;
    ss << in.rdbuf();
    followed = ss.str();
  }
  std::this_thread::sleep_for(300ms);  // another poll or more: still printed once each
  kill(follower, SIGTERM);
  waitpid(follower, nullptr, 0);
  std::ifstream in(follow_out);
  std::stringstream ss;
  ss << in.rdbuf();
  followed = ss.str();
  CHECK_MESSAGE(count_of(followed) == 2, followed);

  REQUIRE(
      !c->define_tags("[[tag]]\nid = \"t\"\ninputs = [\"a\"]\nscript = \"print('got', "
                      "inputs.a) return inputs.a\"\n",
                      false));
  REQUIRE(!c->update_sources({source("a", outrun::Value(5.0))}));
  tag_page(*c, "t", 1);
  std::tie(rc, out) = run_command(cli + "tags log t");
  CHECK_MESSAGE(rc == 0, out);
  CHECK_MESSAGE(out.find(" info got 5.0\n") != std::string::npos, out);
  // outrun eval: the lines on stderr, the value on stdout; in --json with the result.
  std::tie(rc, out) = run_command(std::string(OUTRUN_TEST_CLI) +
                                  " eval -e \"print('hello') return 3\" 2>/dev/null");
  CHECK(rc == 0);
  CHECK(out == "3\n");
  std::tie(rc, out) = run_command(std::string(OUTRUN_TEST_CLI) +
                                  " eval -e \"print('hello') return 3\" 2>&1 >/dev/null");
  CHECK(out == "info: hello\n");
  std::tie(rc, out) =
      run_command(std::string(OUTRUN_TEST_CLI) + " eval --json -e \"log.warn('w') return 3\"");
  CHECK_MESSAGE(out.find("\"logs\":[{\"level\":\"warn\",\"text\":\"w\"}]") != std::string::npos,
                out);
  CHECK(d.stop() == 0);
  // Forwarded to outrund's own log at debug level (read once it exited: debug lines are not
  // flushed one by one).
  std::tie(rc, out) = run_command("cat " + log_file);
  CHECK_MESSAGE(out.find("script 'cli.logger': error: bad news\\n") != std::string::npos, out);
  CHECK_MESSAGE(out.find("tag 't': info: got 5.0") != std::string::npos, out);
  std::remove(log_file.c_str());
  std::remove(follow_out.c_str());
}

TEST_CASE("outrund script logs: only a key's owner or an admin reads its lines") {
  if (geteuid() != 0) {
    MESSAGE("not root: needs a second uid; skipped");
    return;
  }
  const std::string dir = temp_dir();
  const std::string conf = write_temp(dir, "outrund.toml",
                                      "[daemon]\nallowed_uids = [0, 65534]\nsocket_mode = "
                                      "\"0666\"\n");
  Daemon d({"--config", conf});
  REQUIRE(chmod(d.dir.c_str(), 0711) == 0);
  // nobody's child, forked before this process has threads of its own.
  int go[2];
  REQUIRE(pipe(go) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(go[1]);
    char byte = 0;
    if (read(go[0], &byte, 1) != 1) _exit(89);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(90);
    outrun::ClientOptions o;
    o.socket = d.socket;
    o.server_uids = {0};
    std::unique_ptr<outrun::Client> n;
    if (outrun::Client::connect(o, &n)) _exit(91);
    outrun::LogPage page;
    const outrun::Error e = n->script_logs("root.secret", 0, &page);
    if (e.code != outrun::ErrorCode::invalid_argument) _exit(92);
    if (e.message.find("permission denied: uid 65534 may not read the logs of 'root.secret'") ==
        std::string::npos)
      _exit(93);
    outrun::Script s;
    if (n->register_script("nobody.own", "print('mine') return 1", &s)) _exit(94);
    if (n->evaluate(s, {}).get().logs.size() != 1) _exit(95);
    if (n->script_logs("nobody.own", 0, &page) || page.lines.size() != 1) _exit(96);
    _exit(0);
  }
  close(go[0]);
  auto c = d.client();
  outrun::Script s;
  REQUIRE(!c->register_script("root.secret", "print('password is 42') return 1", &s));
  REQUIRE(c->evaluate(s, {}).get().status == outrun::Status::ok);
  REQUIRE(write(go[1], "g", 1) == 1);
  close(go[1]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // root, an admin, reads nobody's.
  outrun::LogPage page;
  REQUIRE(!c->script_logs("nobody.own", 0, &page));
  CHECK(page.lines.size() == 1);
  CHECK(d.stop() == 0);
  std::remove(conf.c_str());
}
