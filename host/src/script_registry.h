// Registered scripts of one runner: SHA-256 and shard computed once, at registration.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "outrun/runner.h"

namespace outrun::detail {

// Stable 64-bit FNV-1a of a script key; its value mod K is the key's shard. Stable across
// processes, builds and restarts (unlike std::hash), so a key always lands on the same shard.
uint64_t route_hash(std::string_view key);

void sha256(std::string_view data, std::array<uint8_t, 32>* out);

class ScriptRegistry {
 public:
  // `max_bytes`: keys and sources of all records together (HostOptions::max_script_bytes).
  ScriptRegistry(const void* owner, uint32_t shards, std::size_t max_bytes = SIZE_MAX)
      : owner_(owner), shards_(shards), max_bytes_(max_bytes) {}

  // Thread-safe. Same key and same source: returns the existing handle. `on_new` runs under the
  // registry's lock for a new record, before any handle to it exists.
  Error add(std::string_view key, std::string_view source, Script* out,
            const std::function<void(ScriptRecord&)>& on_new = {});
  std::size_t size() const;
  uint32_t keys() const;
  // Record by id (ids are dense, 0..size-1). Thread-safe; records never move.
  const ScriptRecord* get(uint32_t id) const;

 private:
  const void* owner_;
  const uint32_t shards_;
  const std::size_t max_bytes_;
  std::size_t bytes_ = 0;  // keys and sources held; guarded by mu_
  mutable std::mutex mu_;                      // guards records_ and by_key_
  std::deque<ScriptRecord> records_;           // deque: records never move
  std::unordered_map<std::string, uint32_t> by_key_;  // latest id per key
  uint32_t keys_ = 0;                                 // distinct keys so far
};

}  // namespace outrun::detail
