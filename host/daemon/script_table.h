// outrund's script table (design/daemon.md, its files and "Registry quotas"): the entry of each
// Host record this daemon handed out a handle for, the entries of each key, and what each uid's
// records are charged (its RegistryQuota). Loop thread only: the Server holds one
// GUARDED_BY(loop_thread); an evaluation in flight shares its entry (a shared_ptr), so its counts
// never mix with a record that later takes the same id.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "log_ring.h"
#include "outrun/runner.h"
#include "registry_quota.h"

namespace outrun::daemon {

inline constexpr int kStatusCount = 11;  // outrun::Status values

// Per registered script (by Host record id): what `outrun scripts` shows. The client's handle is
// `gen << kHandleIdBits | record id` (64 bits; design/protocol.md "Handles"): record ids are
// reused once a record is freed, and the generation, one more at each reuse of the id, keeps a
// stale handle from ever reaching the script that reuses it: a handle of an older generation is
// refused "no longer registered". 42 bits of generation: one id reused every 0.4 ms (a
// register/unregister round trip) wraps in 58 years.
struct ScriptEntry {
  Script script;  // empty once unregistered or replaced (the entry stays for its message)
  std::string key;
  uint64_t gen = 0;       // < 2^kHandleGenBits
  bool replaced = false;  // dropped because its key got another source (not unregistered)
  // The uid whose Register made the record: it owns the key (D-tenancy: only it or an admin may
  // replace or unregister it). Charged to its registry quota while the entry holds the script:
  // the record's bytes when this registration made the record, else 0.
  uint32_t uid = 0;
  std::size_t charge = 0;
  std::array<std::atomic<uint64_t>, kStatusCount> by_status{};
  // What its script printed or logged lately (`outrun logs KEY`): appended on the thread that
  // completes an evaluation, read on the loop thread.
  detail::LogRing logs;
};
inline constexpr int kHandleIdBits = 22;  // record ids are < 2^22
inline constexpr uint32_t kHandleIdMask = (1u << kHandleIdBits) - 1;
inline constexpr int kHandleGenBits = 64 - kHandleIdBits;
// Protocol 1 and 2 clients have 32-bit handles: `gen << 22 | id` for the first
// kLegacyHandleGens generations of an id only; a later one has no 32-bit handle (its Register is
// refused to them), so a 32-bit handle never names another record either.
inline constexpr uint64_t kLegacyHandleGens = uint64_t{1} << (32 - kHandleIdBits);

class ScriptTable {
 public:
  // Record ids of the entries of each key registered here: its current one, dropped when the key
  // is unregistered. Ordered: a ListScripts page starts at a key (lower_bound), so a page costs
  // O(log n + its size).
  using Keys = std::map<std::string, std::vector<uint32_t>, std::less<>>;

  explicit ScriptTable(RegistryQuota quota) : quota_(std::move(quota)) {}

  static uint64_t handle_of(const ScriptEntry& e) { return e.gen << kHandleIdBits | e.script.id(); }
  // The 32-bit handle of protocols 1 and 2 (valid while e.gen < kLegacyHandleGens).
  static uint32_t legacy_handle_of(const ScriptEntry& e) {
    return static_cast<uint32_t>(handle_of(e));
  }

  // The entry of record id `id` (its latest generation; its script is empty once dropped), or a
  // null pointer.
  const std::shared_ptr<ScriptEntry>& at(uint32_t id) const {
    static const std::shared_ptr<ScriptEntry> kNone;
    return id < entries_.size() ? entries_[id] : kNone;
  }
  // The entry of `key`'s latest registration here, or null.
  ScriptEntry* current(std::string_view key) const;

  // `uid`'s Register got `script` from the Host (`charge`: the bytes charged to it when this
  // registration made the record, else 0): its entry. A record new to the table takes the next
  // generation of its id, is charged, and drops the key's earlier entries (`replaced`: their
  // handles go and their charges are released, whoever replaced them; D-tenancy). The same
  // record again is the entry it has.
  ScriptEntry& record(const Script& script, uint32_t uid, std::size_t charge);
  // Unregister: drops every entry of `key` and forgets the key.
  void forget_key(std::string_view key);
  // Drops an entry's script and releases its charge (nothing if dropped already).
  void drop(ScriptEntry& e);

  const Keys& keys() const { return keys_; }
  std::size_t size() const { return entries_.size(); }  // ids ever seen (entries and tombstones)
  std::size_t live() const { return live_; }            // entries with a script
  RegistryQuota& quota() { return quota_; }
  const RegistryQuota& quota() const { return quota_; }

 private:
  // Index = Host record id; grows only.
  std::vector<std::shared_ptr<ScriptEntry>> entries_;
  Keys keys_;
  std::size_t live_ = 0;
  RegistryQuota quota_;  // by peer uid (design/daemon.md "Registry quotas")
};

}  // namespace outrun::daemon
