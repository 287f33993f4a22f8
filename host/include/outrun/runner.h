// The runner interface shared by outrun::Host (out of process) and outrun::InProcess.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outrun/status.h"
#include "outrun/value.h"

namespace outrun {

namespace detail {
// What a runner keeps per registered script. Immutable after registration and alive as long as
// the runner that made it, so a Script handle is a plain pointer.
struct ScriptRecord {
  const void* owner = nullptr;  // the runner that registered it
  uint32_t id = 0;              // dense, per runner
  uint32_t key_id = 0;          // dense, per key (re-registering a key keeps it): single flight
  uint32_t shard = 0;           // stable hash of the key mod shards, computed once
  std::string key;
  std::string source;
  std::array<uint8_t, 32> sha256{};  // of `source`, computed once at registration
  std::string chunk_name;            // how errors name the script ("key:3: ...")
  void* engine = nullptr;            // runner-private (InProcess: the script's Lua state)
};
}  // namespace detail

// Handle of a registered script. Cheap to copy; valid while its runner lives.
class Script {
 public:
  Script() = default;
  bool valid() const { return rec_ != nullptr; }
  const std::string& key() const { return rec_->key; }
  const std::array<uint8_t, 32>& sha256() const { return rec_->sha256; }
  std::string sha256_hex() const;
  uint32_t shard() const { return rec_->shard; }

  // For runner implementations.
  explicit Script(const detail::ScriptRecord* rec) : rec_(rec) {}
  const detail::ScriptRecord* record() const { return rec_; }

 private:
  const detail::ScriptRecord* rec_ = nullptr;
};

struct Result {
  Status status = Status::ok;
  Value value;        // when status == ok
  std::string error;  // otherwise: what happened, with the script's line where there is one
  int shard = -1;     // shard that ran it (-1: none, or InProcess)
};

// Called exactly once per evaluation. Host: on a dispatcher thread, never the I/O loop.
// InProcess: on the calling thread, before evaluate() returns.
using Callback = std::function<void(Result)>;

struct Request {
  Script script;
  Inputs inputs;
};
// Called exactly once per request of a batch, with the request's index.
using BatchCallback = std::function<void(std::size_t index, Result result)>;

// Limits on what a caller may send, checked before anything is queued.
inline constexpr std::size_t kMaxKeySize = 256;
inline constexpr std::size_t kMaxSourceSize = 1u << 20;  // 1 MiB of Lua source
inline constexpr std::size_t kMaxInputs = 4096;

class Runner {
 public:
  virtual ~Runner() = default;

  // Registers (or replaces) a script under `key`. Computes its SHA-256 once, here. Replacing a
  // key with new source gives a new handle; handles to the old source keep working.
  virtual Error register_script(std::string_view key, std::string_view source, Script* out) = 0;

  // Evaluates `script` with `inputs`; `done` is called exactly once.
  virtual void evaluate(const Script& script, Inputs inputs, Callback done) = 0;

  // Same, as a future. Fulfilling the future runs no caller code.
  virtual std::future<Result> evaluate(const Script& script, Inputs inputs) = 0;

  // Many evaluations in one call, written to each shard as few frames as possible. `done` is
  // called once per request, with its index, in no particular order.
  virtual void evaluate_batch(std::vector<Request> requests, BatchCallback done) = 0;

  // TEMPORARY until the unregister branch lands.
  virtual Error unregister_script(std::string_view) { return {}; }
};

}  // namespace outrun
