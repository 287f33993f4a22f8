// Control requests (design/protocol.md "Control"): the documents Stats, Shards and ListScripts
// (documents.cpp), and the admin commands KillShard and RestartShard.
#include <spdlog/spdlog.h>

#include <string>

#include "conn.h"
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
    e = Error{Status::invalid_argument,
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
      case wire::ControlCommand::KillShard:
        e = host_->kill_shard(ctl.shard);
        if (!e) spdlog::info("client {} (pid {}): kill shard {}", c->id, c->pid, ctl.shard);
        break;
      case wire::ControlCommand::RestartShard:
        e = host_->restart_shard(ctl.shard);
        if (!e) spdlog::info("client {} (pid {}): restart shard {}", c->id, c->pid, ctl.shard);
        break;
      default:
        e = Error{Status::invalid_argument, "unknown control command"};
    }
  // A document must fit one frame with room for the rest of the reply, or the client's
  // reader would drop the connection. A ListScripts page is cut well below (kMaxPageBytes);
  // this is the net under every document: refused instead, the connection goes on.
  if (constexpr std::size_t kMaxDocument = protocol::kMaxFrameSize - 4096;
      json.size() > kMaxDocument) {
    e = Error{Status::unavailable, "the document is " + std::to_string(json.size()) +
                                       " bytes, more than a reply frame holds (" +
                                       std::to_string(kMaxDocument) + ")"};
    json.clear();
  }
  f.Clear();
  c->writer.write(protocol::encode_control_reply(
      f, ctl.request_id, static_cast<wire::Status>(e.status), e.message, json));
}

}  // namespace outrun::daemon
