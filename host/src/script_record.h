// What a runner keeps per registered script (opaque in the public runner.h).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "outrun/runner.h"

namespace outrun::detail {
struct RegistryShared;  // script_registry.h

// The bytecode the host's compile-only process made of a record's source (compiler.h). Charged
// to the host's bytecode account while it lives.
struct CompiledChunk {
  std::string bytes;
  std::shared_ptr<std::atomic<int64_t>> account;
  CompiledChunk(std::string b, std::shared_ptr<std::atomic<int64_t>> a)
      : bytes(std::move(b)), account(std::move(a)) {
    account->fetch_add(static_cast<int64_t>(bytes.size()), std::memory_order_relaxed);
  }
  ~CompiledChunk() {
    account->fetch_sub(static_cast<int64_t>(bytes.size()), std::memory_order_relaxed);
  }
  CompiledChunk(const CompiledChunk&) = delete;
  CompiledChunk& operator=(const CompiledChunk&) = delete;
};

// What a runner keeps per registered script. Immutable after registration (but for `refs` and
// `unregistered`). Reference counted: the runner's registry holds one reference while the
// script is registered under its key, every Script handle and every evaluation in flight one
// more; the record is freed (and its bytes leave the registry's account) with the last one.
struct ScriptRecord {
  const void* owner = nullptr;  // the runner that registered it
  uint32_t id = 0;              // dense, per runner; reused after the record is freed
  uint32_t key_id = 0;          // dense, per key (re-registering a key keeps it): single flight
  uint32_t shard = 0;           // stable hash of the key mod shards, computed once
  // Per runner, never reused: (id, serial) names one record. outrun::Client: outrund's 64-bit
  // handle of the script (Registered.handle64).
  uint64_t serial = 0;
  std::string key;
  std::string source;
  std::array<uint8_t, 32> sha256{};      // of `source`, computed once at registration
  std::string chunk_name;                // how errors name the script ("key:3: ...")
  void* engine = nullptr;                // runner-private (InProcess: the script's Lua state)
  void (*free_engine)(void*) = nullptr;  // frees `engine` with the record
  std::size_t bytes = 0;                 // what it costs in the registry's account
  mutable std::atomic<uint32_t> refs{0};
  std::atomic<bool> unregistered{false};  // evaluations of it end `invalid_argument`
  // Host only: its evaluations go to the slow lane (design/decisions.md D-slow-lane), and (below,
  // `slow_behaved`) how many in a row behaved there. Written by whoever reads a result of it (the
  // loop thread or a leader; exchange, so each move is counted once); read, relaxed, when it is
  // routed. Mutable like the crash fields: what the script did. In padding: no bigger record.
  mutable std::atomic<bool> slow{false};
  std::shared_ptr<RegistryShared> registry;  // null: freed by the last reference alone

  // Crashes of a worker while it ran this script (Host only; design/supervision.md "Crash
  // attribution"). Written by the host's loop thread only, read by any thread; times are
  // CLOCK_MONOTONIC ns. Mutable: they describe what the script did, not what it is, and a new
  // source under the key is a new record with none of them.
  mutable std::atomic<uint32_t> crashes{0};         // all crashes charged to it
  mutable std::atomic<uint32_t> window_crashes{0};  // of them, since first_crash_ns
  mutable std::atomic<int64_t> first_crash_ns{0};   // start of the current crash window
  mutable std::atomic<int64_t> last_crash_ns{0};
  mutable std::atomic<int64_t> last_crash{0};  // its exit: signal | exit code << 8 (quarantine.cpp)
  mutable std::atomic<uint32_t> slow_behaved{0};  // see `slow`
  // Quarantined until then (0: not quarantined): its evaluations end `runtime_error` before any
  // worker sees them. Set by the loop thread; cleared by the first evaluation after it passed.
  mutable std::atomic<int64_t> quarantined_until_ns{0};

  // Host only: its bytecode from the compile-only process, set once by the loop thread (release)
  // and read by whoever builds an Evaluation with its source (acquire); null: none (yet). Mutable
  // like the above: a cache of what `source` compiles to, deleted with the record.
  mutable std::atomic<const CompiledChunk*> compiled{nullptr};

  ScriptRecord() = default;
  ~ScriptRecord() { delete compiled.load(std::memory_order_acquire); }
  ScriptRecord(const ScriptRecord&) = delete;
  ScriptRecord& operator=(const ScriptRecord&) = delete;
};

// How a runner reaches a handle's record, and makes a handle of one (the public Script keeps
// both private: a user cannot forge a handle from a pointer or read the record).
struct ScriptAccess {
  static const ScriptRecord* record(const Script& s) { return s.record(); }
  // A new reference to `rec`.
  static Script make(const ScriptRecord* rec) { return Script(rec); }
};
inline const ScriptRecord* record_of(const Script& s) {
  return ScriptAccess::record(s);
}

}  // namespace outrun::detail
