// The script table's frames: Register (a handle per record, charged to the peer uid's registry
// quota: design/daemon.md "Registry quotas") and Unregister (every handle of the key goes). A
// key belongs to the uid that registered its record: only it or an admin may replace or
// unregister it (design/daemon.md "Who owns a key"); keys of the internal namespace are
// nobody's to name.
#include <spdlog/spdlog.h>

#include <span>
#include <string>

#include "conn.h"
#include "error_wire.h"
#include "outrun/protocol/client_messages.h"
#include "server.h"

namespace outrun::daemon {

namespace {
// The internal namespace (runner.h kInternalKeyPrefix: the tags engine's scripts) is not a
// client's to name.
Error check_client_key(std::string_view key) {
  if (is_internal_key(key))
    return {ErrorCode::invalid_argument,
            "script keys starting with a NUL byte are reserved (outrund's tags)"};
  return {};
}
}  // namespace

Error Server::check_owner(const Conn& c, std::string_view key, uint32_t owner,
                          const char* what) const {
  if (c.admin || c.uid == owner) return {};
  spdlog::warn("client {} (pid {} uid {}): {} '{}' refused: registered by uid {}", c.id, c.pid,
               c.uid, what, key.substr(0, 256), owner);
  return {ErrorCode::invalid_argument,
          "permission denied: uid " + std::to_string(c.uid) + " may not " + what + " '" +
              std::string(key) + "', registered by uid " + std::to_string(owner) +
              " (only that uid or an admin may: daemon.admin_uids, admin_gids)"};
}

void Server::handle_register(const std::shared_ptr<Conn>& c, const protocol::RegisterMsg& r) {
  // `check` (D-register-check): the compile-only process compiles the source first, and the
  // loop goes on meanwhile; this connection alone waits (not read, its frames not handled) so
  // that its answers stay in order. A source that does not compile is answered CompileError
  // and registers nothing; one that does is registered as without `check`.
  if (r.check && r.key && r.source && !check_client_key(*r.key)) {
    c->phase.begin_check();
    update_poll(c.get());
    std::weak_ptr<Conn> weak = c;
    host_->check_source(*r.key, *r.source,
                        [this, weak, id = r.request_id, key = std::string(*r.key),
                         source = std::string(*r.source)](Error e) {
                          loop_thread.assert_here();  // Host::check_source answers on the loop
                          const std::shared_ptr<Conn> conn = weak.lock();
                          if (!conn || conn->phase.closed()) return;
                          conn->phase.end_check();
                          if (e) {
                            flatbuffers::FlatBufferBuilder& fb = t_fbb;
                            fb.Clear();
                            conn->writer.write(protocol::encode_registered(
                                fb, id, detail::wire_status(e.code), e.message, 0, 0, {}, 0));
                          } else {
                            handle_register(conn, protocol::RegisterMsg{id, key, source, false});
                          }
                          if (conn->phase.closed()) return;
                          update_poll(conn.get());
                          handle_frames(conn);  // what it sent meanwhile
                        });
    return;
  }
  flatbuffers::FlatBufferBuilder& f = t_fbb;
  Script script;
  Error e;
  // A new record is charged to the peer's uid (D-quota); `admit` runs only for a new one: a new
  // key, or another source under a key, which only the key's owner or an admin may (D-tenancy).
  std::size_t charge = 0;
  auto admit = [&](std::size_t bytes) {
    loop_thread.assert_here();  // called by register_script below, on this thread
    if (const ScriptEntry* cur = scripts_.current(*r.key))
      if (Error o = check_owner(*c, *r.key, cur->uid, "replace")) return o;
    // A uid in its crash cool-down makes no new record (D-crash-budget): new bytes under a key
    // are what dodged the script's quarantine. A registration of what is held still works.
    if (std::string why = crash_budget_.refusal(c->uid, std::chrono::steady_clock::now());
        !why.empty()) {
      crash_budget_.count_refusals(1);
      return Error{ErrorCode::unavailable, std::move(why)};
    }
    Error q = scripts_.quota().admit(c->uid, bytes);
    if (!q) charge = bytes;
    return q;
  };
  if (!r.key || !r.source)
    e = Error{ErrorCode::invalid_argument, "register needs a key and a source"};
  else if (!(e = check_client_key(*r.key)))
    e = host_->register_script(*r.key, *r.source, &script, admit);
  uint64_t handle = 0;
  uint32_t legacy = 0;
  if (!e) {
    // A new record replaces the key's earlier one: its handle goes and its charge is released,
    // whoever replaced it (D-tenancy: a record no handle reaches is charged to nobody).
    const ScriptEntry& entry = scripts_.record(script, c->uid, charge);
    handle = ScriptTable::handle_of(entry);
    // Protocols 1 and 2 only: a protocol 3 client uses handle64 (none is written for it).
    if (c->protocol < 3) legacy = ScriptTable::legacy_handle_of(entry);
    if (c->protocol < 3 && entry.gen >= kLegacyHandleGens)
      e = Error{ErrorCode::invalid_argument,
                "this script's handle needs 64 bits (its record id was reused more than " +
                    std::to_string(kLegacyHandleGens - 1) +
                    " times): speak protocol 3 to outrund (design/protocol.md \"Handles\")"};
  }
  f.Clear();
  std::span<const uint8_t> sha;
  int shard = 0;
  if (!e) {
    sha = script.sha256();
    shard = static_cast<int>(script.shard());
  }
  c->writer.write(protocol::encode_registered(f, r.request_id, detail::wire_status(e.code),
                                              e.message, handle, legacy, sha, shard));
}

void Server::handle_unregister(const std::shared_ptr<Conn>& c, const protocol::UnregisterMsg& u) {
  flatbuffers::FlatBufferBuilder& f = t_fbb;
  Error e;
  const ScriptEntry* cur = u.key ? scripts_.current(*u.key) : nullptr;
  if (!u.key) {
    e = Error{ErrorCode::invalid_argument, "unregister needs a key"};
  } else if ((e = check_client_key(*u.key))) {
  } else if (cur && (e = check_owner(*c, *u.key, cur->uid, "unregister"))) {
  } else {
    e = host_->unregister_script(*u.key);
    if (!e) {
      // Every handle of the key this daemon gave out goes. Its record is freed once its
      // evaluations in flight end.
      scripts_.forget_key(*u.key);
      spdlog::info("client {} (pid {}): unregistered '{}'", c->id, c->pid, u.key->substr(0, 256));
    }
  }
  f.Clear();
  c->writer.write(
      protocol::encode_unregistered(f, u.request_id, detail::wire_status(e.code), e.message));
}

}  // namespace outrun::daemon
