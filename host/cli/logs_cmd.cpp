// `outrun logs KEY` / `outrun tags log ID` (design/daemon.md "Script logs"): reads the ring
// through outrund's ScriptLogs / TagLogs control command; --follow asks again every 250 ms from
// the last page's `next`, so no line is printed twice and a line the ring dropped before it was
// read is reported as missed.
#include "logs_cmd.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "outrun/client.h"

namespace outrun::cli {

namespace {

struct LogsArgs {
  std::string name;
  bool follow = false;
  bool json = false;
  uint64_t since = 0;
};

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
    case LogLevel::info:
      break;
  }
  return "info";
}

int run_logs(const LogsArgs& a, bool tag, const std::string& socket) {
  ClientOptions o;
  o.socket = socket;
  if (o.socket.empty())
    if (const char* env = std::getenv("OUTRUN_SOCKET"); env && *env) o.socket = env;
  o.name = "outrun-cli";
  std::unique_ptr<Client> c;
  if (Error err = Client::connect(o, &c)) {
    std::cerr << to_string(err.code) << ": " << err.message << "\n";
    return 3;
  }
  uint64_t since = a.since;
  uint64_t dropped_seen = 0;
  for (;;) {
    LogPage page;
    if (Error err =
            tag ? c->tag_logs(a.name, since, &page) : c->script_logs(a.name, since, &page)) {
      std::cerr << to_string(err.code) << ": " << err.message << "\n";
      return err.code == ErrorCode::unavailable ? 3 : 1;
    }
    // What a follower could not see: lines overwritten before this read, lines never kept.
    if (page.missed != 0)
      std::cerr << "(" << page.missed << " lines were overwritten before they were read)\n";
    if (page.dropped > dropped_seen)
      std::cerr << "(" << page.dropped - dropped_seen
                << " lines were dropped: more than an evaluation may log, or the rate limit)\n";
    dropped_seen = page.dropped;
    for (const LogRecord& l : page.lines) {
      const std::string time = format_datetime(DateTime::from_unix_micros(l.unix_us));
      if (a.json) {
        nlohmann::json j{
            {"seq", l.seq}, {"time", time}, {"level", level_name(l.level)}, {"text", l.text}};
        std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      } else {
        std::cout << time << " " << level_name(l.level) << " " << l.text << "\n";
      }
    }
    std::cout.flush();
    since = page.next;
    if (!a.follow) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

void add_options(CLI::App* cmd, LogsArgs* a, const char* what) {
  cmd->add_option(what[0] == 'k' ? "key" : "id", a->name, what)->required();
  cmd->add_flag("-f,--follow", a->follow, "print new lines as they come, until SIGINT");
  cmd->add_option("--since", a->since,
                  "from this line number on (as `seq` in --json; default: the oldest kept)");
  cmd->add_flag("--json", a->json, "one JSON object per line: {seq, time, level, text}");
}

}  // namespace

void add_logs_commands(CLI::App& app, int* rc, const std::string* socket) {
  static LogsArgs script_args, tag_args;
  auto* logs = app.add_subcommand(
      "logs", "outrund: what a registered script printed or logged lately (its owner or an admin)");
  add_options(logs, &script_args, "key: the script's key");
  logs->callback([rc, socket] { *rc = run_logs(script_args, false, *socket); });
  if (CLI::App* tags = app.get_subcommand("tags")) {
    auto* log =
        tags->add_subcommand("log", "outrund: what a tag's script printed or logged lately");
    add_options(log, &tag_args, "id: the tag's id");
    log->callback([rc, socket] { *rc = run_logs(tag_args, true, *socket); });
  }
}

}  // namespace outrun::cli
