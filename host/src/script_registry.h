// Registered scripts of one runner: SHA-256 and shard computed once, at registration; records
// reference counted and freed with their last reference (design/decisions.md D-unreg).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "outrun/runner.h"
#include "outrun/thread_annotations.h"
#include "script_record.h"

namespace outrun::detail {

// Stable 64-bit FNV-1a of a script key; its value mod K is the key's shard. Stable across
// processes, builds and restarts (unlike std::hash), so a key always lands on the same shard.
uint64_t route_hash(std::string_view key);

void sha256(std::string_view data, std::array<uint8_t, 32>* out);

class ScriptRegistry;

// Shared by a registry and its records, so that a handle that outlives its runner can still be
// dropped: the record is then deleted without any accounting.
struct RegistryShared {
  Mutex mu;  // guards `reg` and everything in the ScriptRegistry that it points to
  ScriptRegistry* reg GUARDED_BY(mu) = nullptr;  // null once the registry is gone
};

class ScriptRegistry {
 public:
  // `max_bytes`: what all records together may cost (HostOptions::max_script_bytes).
  // `deferred_ids`: a freed record's id is not reused until recycle() gives it back (Host: after
  // the Forget frame for it is queued to the shard's worker). Otherwise at once.
  ScriptRegistry(const void* owner, uint32_t shards, std::size_t max_bytes = SIZE_MAX,
                 bool deferred_ids = false);
  ~ScriptRegistry();
  ScriptRegistry(const ScriptRegistry&) = delete;
  ScriptRegistry& operator=(const ScriptRegistry&) = delete;

  // Thread-safe. Same key and same source: returns the existing handle. `on_new` runs under the
  // registry's lock for a new record, before any handle to it exists. `admit` (outrund's per-uid
  // quota) runs under the lock before a new record is made, with what it would cost
  // (ScriptRecord::bytes), once the registry's own limits passed; an error it returns is the
  // registration's, and once it returned none the record is made. Not called when the key
  // already holds this source.
  Error add(std::string_view key, std::string_view source, Script* out,
            const std::function<void(ScriptRecord&)>& on_new = {}, const AdmitFn& admit = {})
      EXCLUDES(shared_->mu);
  // Thread-safe. Removes `key`: its record is marked unregistered and the registry's reference
  // dropped. Unknown key: invalid_argument.
  Error remove(std::string_view key) EXCLUDES(shared_->mu);
  RegistryStats stats() const EXCLUDES(shared_->mu);
  std::size_t size() const EXCLUDES(shared_->mu);  // records alive
  uint32_t keys() const EXCLUDES(shared_->mu);     // key ids in use

  // Thread-safe. A new reference to the record (id, serial) if it is still alive, else none:
  // lets the compile-only process's queue name records without keeping them alive.
  Script acquire(uint32_t id, uint64_t serial) const EXCLUDES(shared_->mu);

  // deferred_ids: runs under the registry's lock when a freed id waits for recycle() (Host: wakes
  // the loop). Cleared before the runner's state goes.
  void set_on_retire(std::function<void()> f) EXCLUDES(shared_->mu);
  // deferred_ids: (shard, id) of the records freed since the last call.
  void take_retired(std::vector<std::pair<uint32_t, uint32_t>>* out) EXCLUDES(shared_->mu);
  // deferred_ids: these ids may be given to new records now.
  void recycle(const std::vector<uint32_t>& ids) EXCLUDES(shared_->mu);
  // Records freed while they were in a Host's slow lane (ScriptRecord::slow): SlowLaneStats.
  uint64_t freed_slow() const { return freed_slow_.load(std::memory_order_relaxed); }

 private:
  friend void release_script_record(const ScriptRecord* rec);
  void freed(ScriptRecord* r) REQUIRES(shared_->mu);  // the record is deleted by the caller

  const void* owner_;
  const uint32_t shards_;
  const std::size_t max_bytes_;
  const bool deferred_ids_;
  const std::shared_ptr<RegistryShared> shared_;
  std::atomic<uint64_t> freed_slow_{0};
  std::size_t bytes_ GUARDED_BY(shared_->mu) = 0;    // what live records cost
  std::size_t records_ GUARDED_BY(shared_->mu) = 0;  // live records
  uint32_t next_id_ GUARDED_BY(shared_->mu) = 0;
  uint64_t next_serial_ GUARDED_BY(shared_->mu) = 1;
  std::vector<ScriptRecord*> by_id_ GUARDED_BY(shared_->mu);  // live records (acquire)
  std::vector<uint32_t> free_ids_ GUARDED_BY(shared_->mu);
  // (shard, id), deferred_ids only
  std::vector<std::pair<uint32_t, uint32_t>> retired_ GUARDED_BY(shared_->mu);
  uint32_t next_key_id_ GUARDED_BY(shared_->mu) = 0;
  std::vector<uint32_t> free_key_ids_ GUARDED_BY(shared_->mu);
  std::vector<uint32_t> key_refs_ GUARDED_BY(shared_->mu);  // by key id: live records with it
  // The registry's reference to each key's record.
  std::unordered_map<std::string, Script> by_key_ GUARDED_BY(shared_->mu);
  std::function<void()> on_retire_ GUARDED_BY(shared_->mu);
};

}  // namespace outrun::detail
