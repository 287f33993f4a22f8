// The script table's frames: Register (a handle per record, charged to the peer uid's registry
// quota: design/daemon.md "Registry quotas") and Unregister (every handle of the key goes).
#include <spdlog/spdlog.h>

#include <span>
#include <string>

#include "conn.h"
#include "outrun/protocol/client_messages.h"
#include "server.h"

namespace outrun::daemon {

void Server::handle_register(const std::shared_ptr<Conn>& c, const protocol::RegisterMsg& r) {
  flatbuffers::FlatBufferBuilder& f = t_fbb;
  Script script;
  Error e;
  // A new record is charged to the peer's uid (D-quota); `admit` runs only for a new one.
  std::size_t charge = 0;
  auto admit = [&](std::size_t bytes) {
    loop_thread.assert_here();  // called by register_script below, on this thread
    Error q = quota_.admit(c->uid, bytes);
    if (!q) charge = bytes;
    return q;
  };
  if (!r.key || !r.source)
    e = Error{Status::invalid_argument, "register needs a key and a source"};
  else
    e = host_->register_script(*r.key, *r.source, &script, admit);
  uint32_t handle = 0;
  if (!e) {
    const uint32_t id = script.id();
    if (scripts_.size() <= id) scripts_.resize(id + 1);
    auto& slot = scripts_[id];
    if (!slot || !(slot->script == script)) {
      // A new record (an index whose entry is a tombstone, or a new one).
      auto entry = std::make_shared<ScriptEntry>();
      entry->gen = slot ? (slot->gen + 1) & ((1u << (32 - kHandleIdBits)) - 1) : 0;
      entry->key = script.key();
      entry->script = script;
      entry->uid = c->uid;
      entry->charge = charge;
      if (charge) quota_.charge(c->uid, charge);
      slot = std::move(entry);
      ++live_scripts_;
      key_entries_[script.key()].push_back(id);
    }
    handle = handle_of(*slot);
  }
  f.Clear();
  std::span<const uint8_t> sha;
  int shard = 0;
  if (!e) {
    sha = script.sha256();
    shard = static_cast<int>(script.shard());
  }
  c->writer.write(protocol::encode_registered(f, r.request_id, static_cast<wire::Status>(e.status),
                                              e.message, handle, sha, shard));
}

void Server::handle_unregister(const std::shared_ptr<Conn>& c, const protocol::UnregisterMsg& u) {
  flatbuffers::FlatBufferBuilder& f = t_fbb;
  Error e;
  if (!u.key) {
    e = Error{Status::invalid_argument, "unregister needs a key"};
  } else {
    e = host_->unregister_script(*u.key);
    if (!e) {
      // Every handle of the key this daemon gave out goes: the current one and those it
      // replaced. Their records are freed once their evaluations in flight end.
      if (auto it = key_entries_.find(*u.key); it != key_entries_.end()) {
        for (uint32_t id : it->second)
          if (scripts_[id]) drop_entry(*scripts_[id]);
        key_entries_.erase(it);
      }
      spdlog::info("client {} (pid {}): unregistered '{}'", c->id, c->pid, u.key->substr(0, 256));
    }
  }
  f.Clear();
  c->writer.write(protocol::encode_unregistered(f, u.request_id,
                                                static_cast<wire::Status>(e.status), e.message));
}

void Server::drop_entry(ScriptEntry& e) {
  if (!e.script.valid()) return;
  e.script = Script();
  --live_scripts_;
  if (e.charge) quota_.release(e.uid, e.charge);
  e.charge = 0;
}

}  // namespace outrun::daemon
