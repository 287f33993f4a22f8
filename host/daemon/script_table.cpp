#include "script_table.h"

namespace outrun::daemon {

ScriptEntry* ScriptTable::current(std::string_view key) const {
  auto it = keys_.find(key);
  if (it == keys_.end() || it->second.empty()) return nullptr;
  return entries_[it->second.back()].get();
}

ScriptEntry& ScriptTable::record(const Script& script, uint32_t uid, std::size_t charge) {
  const uint32_t id = script.id();
  if (entries_.size() <= id) entries_.resize(id + 1);
  auto& slot = entries_[id];
  if (!slot || !(slot->script == script)) {
    // A new record (an index whose entry is a tombstone, or a new one). The key's earlier
    // record, if any, was replaced.
    auto& ids = keys_[script.key()];
    for (uint32_t old : ids)
      if (entries_[old] && entries_[old]->script.valid()) {
        entries_[old]->replaced = true;
        drop(*entries_[old]);
      }
    ids.clear();
    auto entry = std::make_shared<ScriptEntry>();
    entry->gen = slot ? (slot->gen + 1) & ((uint64_t{1} << kHandleGenBits) - 1) : 0;
    entry->key = script.key();
    entry->script = script;
    entry->uid = uid;
    entry->charge = charge;
    if (charge) quota_.charge(uid, charge);
    slot = std::move(entry);
    ++live_;
    ids.push_back(id);
  }
  return *slot;
}

void ScriptTable::forget_key(std::string_view key) {
  auto it = keys_.find(key);
  if (it == keys_.end()) return;
  for (uint32_t id : it->second)
    if (entries_[id]) drop(*entries_[id]);
  keys_.erase(it);
}

void ScriptTable::drop(ScriptEntry& e) {
  if (!e.script.valid()) return;
  e.script = Script();
  --live_;
  if (e.charge) quota_.release(e.uid, e.charge);
  e.charge = 0;
}

}  // namespace outrun::daemon
