// Control requests (design/protocol.md "Control"): the documents Stats, Shards and ListScripts
// (documents.cpp), and the admin commands KillShard and RestartShard.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "conn.h"
#include "error_wire.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "server.h"

namespace outrun::daemon {

void Server::handle_control(const std::shared_ptr<Conn>& c, const protocol::ControlMsg& ctl) {
  flatbuffers::FlatBufferBuilder& f = t_fbb;
  Error e;
  std::string json;
  const bool admin_command = ctl.command == wire::ControlCommand::KillShard ||
                             ctl.command == wire::ControlCommand::RestartShard;
  if (admin_command && !c->admin) {
    spdlog::warn("client {} (pid {} uid {}): {} refused: not an admin", c->id, c->pid, c->uid,
                 wire::EnumNameControlCommand(ctl.command));
    e = Error{ErrorCode::invalid_argument,
              "permission denied: uid " + std::to_string(c->uid) +
                  " may evaluate but not administer outrund (daemon.admin_uids, admin_gids)"};
  } else
    switch (ctl.command) {
      case wire::ControlCommand::Stats:
        json = stats_json(false);
        break;
      case wire::ControlCommand::Shards:
        json = stats_json(true);
        break;
      case wire::ControlCommand::ListScripts:
        e = scripts_json(ctl.after, ctl.limit, &json);
        break;
      case wire::ControlCommand::ScriptLogs:
        e = script_logs_json(*c, ctl.key, ctl.since, ctl.limit, &json);
        break;
      case wire::ControlCommand::TagLogs:
        e = tag_logs_json(ctl.key, ctl.since, ctl.limit, &json);
        break;
      case wire::ControlCommand::KillShard:
        e = host_->kill_shard(ctl.shard);
        if (!e) spdlog::info("client {} (pid {}): kill shard {}", c->id, c->pid, ctl.shard);
        break;
      case wire::ControlCommand::RestartShard:
        e = host_->restart_shard(ctl.shard);
        if (!e) spdlog::info("client {} (pid {}): restart shard {}", c->id, c->pid, ctl.shard);
        break;
      default:
        e = Error{ErrorCode::invalid_argument, "unknown control command"};
    }
  // A document must fit one frame with room for the rest of the reply, or the client's
  // reader would drop the connection. A ListScripts page is cut well below (kMaxPageBytes);
  // this is the net under every document: refused instead, the connection goes on.
  if (constexpr std::size_t kMaxDocument = protocol::kMaxFrameSize - 4096;
      json.size() > kMaxDocument) {
    e = Error{ErrorCode::unavailable, "the document is " + std::to_string(json.size()) +
                                          " bytes, more than a reply frame holds (" +
                                          std::to_string(kMaxDocument) + ")"};
    json.clear();
  }
  f.Clear();
  c->writer.write(protocol::encode_control_reply(f, ctl.request_id, detail::wire_status(e.code),
                                                 e.message, json));
}

namespace {
// {"key"|"tag": ..., "lines": [{"seq", "time", "level", "text"}], "next", "missed", "dropped"}
// (design/protocol.md "Script logs").
std::string log_page_json(const char* what, std::string_view name, const LogPage& page) {
  nlohmann::json lines = nlohmann::json::array();
  for (const LogRecord& l : page.lines)
    lines.push_back({{"seq", l.seq},
                     {"time", format_datetime(DateTime::from_unix_micros(l.unix_us))},
                     {"level", detail::script_level_name(l.level)},
                     {"text", l.text}});
  nlohmann::json doc = {{what, name},
                        {"lines", std::move(lines)},
                        {"next", page.next},
                        {"missed", page.missed},
                        {"dropped", page.dropped}};
  return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
// A page is at most 1000 lines (64 are kept per ring: `limit` only ever shortens it).
constexpr uint32_t kMaxLogPage = 1000;
}  // namespace

Error Server::script_logs_json(const Conn& c, std::string_view key, uint64_t since, uint32_t limit,
                               std::string* out) {
  ScriptEntry* cur = key.empty() ? nullptr : scripts_.current(key);
  if (!cur)
    return {ErrorCode::invalid_argument,
            "no script is registered under '" + std::string(key.substr(0, 256)) + "'"};
  ScriptEntry& e = *cur;
  // A script's lines may hold its inputs: only the uid that registered it or an admin reads them.
  if (Error o = check_owner(c, key, e.uid, "read the logs of")) return o;
  *out = log_page_json("key", key,
                       e.logs.read(since, std::min(limit ? limit : kMaxLogPage, kMaxLogPage)));
  return {};
}

Error Server::tag_logs_json(std::string_view id, uint64_t since, uint32_t limit, std::string* out) {
  if (!tags_.running()) return {ErrorCode::unavailable, "the tags engine is not running"};
  LogPage page;
  if (Error e =
          tags_.engine().logs(id, since, std::min(limit ? limit : kMaxLogPage, kMaxLogPage), &page))
    return e;
  *out = log_page_json("tag", id, page);
  return {};
}

}  // namespace outrun::daemon
