// The runner interface shared by outrun::Host (out of process) and outrun::InProcess.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outrun/log.h"
#include "outrun/status.h"
#include "outrun/value.h"

namespace outrun {

namespace detail {
// What a runner keeps per registered script: private to the runners (host/src/script_record.h).
struct ScriptRecord;
// Drops one reference; the last one frees the record (through its registry, if any).
void release_script_record(const ScriptRecord* rec);
void retain_script_record(const ScriptRecord* rec);
// Makes EncodedInputs from bytes already checked (host/codec/wire_codec.h).
struct EncodedInputsAccess;
// The runners' way to a Script's record and back (host/src/script_record.h); not for users.
struct ScriptAccess;
}  // namespace detail

// Handle of a registered script. Cheap to copy (one atomic increment); keeps its record alive,
// so it is safe to hold and to evaluate after its script was replaced or unregistered (an
// unregistered script's evaluations end `invalid_argument`). A handle may be copied, used and
// dropped on any thread; one handle object is not for concurrent assignment.
class Script {
 public:
  Script() = default;
  Script(const Script& o) : rec_(o.rec_) { retain(); }
  Script(Script&& o) noexcept : rec_(o.rec_) { o.rec_ = nullptr; }
  Script& operator=(const Script& o) {
    if (this != &o) {
      Script copy(o);
      std::swap(rec_, copy.rec_);
    }
    return *this;
  }
  Script& operator=(Script&& o) noexcept {
    if (this != &o) {
      Script old(std::move(*this));
      rec_ = o.rec_;
      o.rec_ = nullptr;
    }
    return *this;
  }
  ~Script() {
    if (rec_) detail::release_script_record(rec_);
  }

  // Preconditions: the accessors below but valid() and registered() need valid().
  bool valid() const { return rec_ != nullptr; }
  const std::string& key() const;
  const std::string& source() const;
  const std::array<uint8_t, 32>& sha256() const;
  std::string sha256_hex() const;
  uint32_t shard() const;
  // Dense per runner, unique among its live records; reused once a record is freed.
  uint32_t id() const;
  // False once the script was unregistered (its evaluations end `invalid_argument`).
  bool registered() const;
  // The same record: the same registration (same key and source, same runner).
  friend bool operator==(const Script& a, const Script& b) { return a.rec_ == b.rec_; }

 private:
  // For runner implementations, through detail::ScriptAccess: a new reference to `rec`.
  friend struct detail::ScriptAccess;
  explicit Script(const detail::ScriptRecord* rec) : rec_(rec) { retain(); }
  const detail::ScriptRecord* record() const { return rec_; }

  void retain() {
    if (rec_) detail::retain_script_record(rec_);
  }
  const detail::ScriptRecord* rec_ = nullptr;
};

// What a runner's registry holds: records alive (registered, or replaced/unregistered but still
// used by a handle or an evaluation) and what they cost. `bytes` counts, per record, its key,
// source and chunk name plus kScriptRecordOverhead.
struct RegistryStats {
  std::size_t scripts = 0;
  std::size_t bytes = 0;
};
// An estimate of what a record costs beyond its strings: the ScriptRecord itself (~260 B with
// its allocation header and its crash counters), its entry in the key index (~70 B: node, hash,
// bucket) and the copy of the key in that entry. Counted against max_script_bytes.
inline constexpr std::size_t kScriptRecordOverhead = 360;
// What a new record of `key` and `source` costs in its registry's account (ScriptRecord::bytes):
// the key (record), the source, the chunk name (= key) and kScriptRecordOverhead.
constexpr std::size_t script_record_bytes(std::string_view key, std::string_view source) {
  return 2 * key.size() + source.size() + kScriptRecordOverhead;
}
// Asked before a registration makes a new record, with what it would cost; an error refuses it
// (Host::register_script's overload: outrund's per-uid registry quotas).
using AdmitFn = std::function<Error(std::size_t bytes)>;

// Options of a registration (Host::register_script, Client::register_script).
struct RegisterOptions {
  // Compile-check the source before registering it (design/decisions.md D-register-check): one
  // that does not compile fails `compile_error` with Lua's message ("KEY:LINE: ...") and nothing
  // is registered: the registry is unchanged (a record the key already holds stays).
  bool check = false;
};

// What a script said during one evaluation with print(...) (info) or log.debug/info/warn/error(...)
// (design/sandbox.md "Script logs"). `text` is UTF-8 without control characters (they are
// escaped as \n, \t, \xNN) and at most 256 bytes; an evaluation keeps at most 16 lines and 2 KiB.
// LogLevel is log.h's (debug, info, warn, error, numbered as on the wire).
struct LogLine {
  LogLevel level = LogLevel::info;
  std::string text;
};

// A script's or a tag's recent log lines, as outrund keeps them (`outrun logs KEY`,
// `outrun tags log ID`; design/daemon.md "Script logs"): each line numbered in its ring from 1 and
// stamped with the time it was received (µs since the Unix epoch).
struct LogRecord {
  uint64_t seq = 0;
  int64_t unix_us = 0;
  LogLevel level = LogLevel::info;
  std::string text;
};
// One read of a ring: its lines numbered `since` and after, oldest first. `next`: the `since` of
// the next read (one past the newest line). `missed`: lines from `since` on that the ring no
// longer had (overwritten before this read). `dropped`: lines the script logged that never
// reached the ring at all (caps and rate limits), in the ring's life.
struct LogPage {
  std::vector<LogRecord> lines;
  uint64_t next = 1;
  uint64_t missed = 0;
  uint64_t dropped = 0;
};

struct Result {
  Status status = Status::ok;
  Value value;        // when status == ok
  std::string error;  // otherwise: what happened, with the script's line where there is one
  int shard = -1;     // shard that ran it (-1: none, or InProcess)
  // Host only: this evaluation is the one its worker's death is charged to -- it was running
  // when the worker died of a fault signal or an exit a script can cause (the crash its script
  // record is charged with, design/supervision.md "Crash attribution"), or its worker was killed
  // because it ran past timeout + grace. False for the bystanders of a death, for kills for
  // silence or on request, and on every result of InProcess and outrun::Client (the wire does
  // not carry it). outrund charges such a crash to the client that sent the evaluation
  // (design/decisions.md D-crash-budget).
  bool killed_worker = false;
  // What the script logged during this evaluation, whatever its status (empty when it logged
  // nothing, or its worker died before it answered); `logs_dropped` lines more were not kept
  // (per-evaluation caps, the per-script rate limit).
  std::vector<LogLine> logs{};
  uint32_t logs_dropped = 0;
};

namespace detail {
// What stands behind a Future: each runner has its own (host/src/future_state.h).
class FutureState {
 public:
  virtual ~FutureState() = default;
  // Returns once the result is in.
  virtual void wait() = 0;
  // Waits at most `d`; true once the result is in.
  virtual bool wait_for(std::chrono::nanoseconds d) = 0;
  // The result, moved out: once, after wait() or a wait_for() that returned true.
  virtual Result take() = 0;
  // The Future let go without taking the result (its evaluation goes on).
  virtual void abandon() {}
};
}  // namespace detail

// One evaluation's result, later (Runner::evaluate). Like std::future<Result>: move-only, get()
// once, and destroying it does not cancel the evaluation. A Host's future waits the way
// evaluate_sync does: a caller blocked in get() or wait() reads its shard's results itself when
// nobody else does (leader/follower, design/threading.md), so an idle round trip costs the host
// one wake-up, the caller's. A timed wait (wait_for, wait_until) only waits to be handed the
// result. Fulfilling a future runs no caller code. Waiting on one in a callback that runs on a
// Host's loop thread (callbacks_on_loop) never returns; a future may outlive its runner.
// Several threads may wait on one future at once (they wait one after the other); moving,
// assigning or destroying it while another thread waits on it is not allowed.
class Future {
 public:
  Future() noexcept = default;
  explicit Future(std::shared_ptr<detail::FutureState> s) noexcept : s_(std::move(s)) {}
  Future(Future&&) noexcept = default;
  Future& operator=(Future&& o) noexcept {
    if (this != &o) {
      Future old(std::move(*this));
      s_ = std::move(o.s_);
    }
    return *this;
  }
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;
  ~Future() {
    if (s_) s_->abandon();
  }

  bool valid() const noexcept { return s_ != nullptr; }
  // Waits for the result and returns it; valid() is false afterwards. Precondition: valid().
  Result get() {
    std::shared_ptr<detail::FutureState> s = std::move(s_);
    s->wait();
    return s->take();
  }
  void wait() const { s_->wait(); }
  // `ready` or `timeout` (never `deferred`). Zero, negative or NaN: polls; a year or more:
  // waits like wait().
  template <class Rep, class Period>
  std::future_status wait_for(const std::chrono::duration<Rep, Period>& d) const {
    const std::chrono::duration<double> secs = d;  // any ratio, no overflow
    if (!(secs > secs.zero())) return poll(std::chrono::nanoseconds(0));
    if (secs >= std::chrono::hours(24 * 365)) {
      s_->wait();
      return std::future_status::ready;
    }
    return poll(std::chrono::ceil<std::chrono::nanoseconds>(secs));
  }
  template <class Clock, class Duration>
  std::future_status wait_until(const std::chrono::time_point<Clock, Duration>& t) const {
    const auto now = Clock::now();
    if (t <= now) return poll(std::chrono::nanoseconds(0));
    return wait_for(t - now);
  }

 private:
  std::future_status poll(std::chrono::nanoseconds d) const {
    return s_->wait_for(d) ? std::future_status::ready : std::future_status::timeout;
  }
  std::shared_ptr<detail::FutureState> s_;
};

// Called exactly once per evaluation. Host: on a dispatcher thread, never the I/O loop.
// InProcess: on the calling thread, before evaluate() returns.
using Callback = std::function<void(Result)>;

// One evaluation's inputs already in wire form: the bytes of an InputList FlatBuffer
// (design/protocol.md "Encoded inputs"), as an outrun client sends them. Made only by `from`,
// which verifies the buffer and checks the inputs under the rules `Inputs` are held to (4096
// inputs, 8 MiB as counted there, nesting 32, no tag-only kinds; at most 8 MiB of bytes). A
// Host copies the bytes into the worker's frame as they are: outrund passes a client's inputs
// on without decoding them. The bytes are kept 8-byte aligned (they are read in place).
class EncodedInputs {
 public:
  EncodedInputs() = default;
  EncodedInputs(const EncodedInputs& o) { assign(o.data(), o.size_); }
  EncodedInputs& operator=(const EncodedInputs& o) {
    if (this != &o) assign(o.data(), o.size_);
    return *this;
  }
  EncodedInputs(EncodedInputs&& o) noexcept : words_(std::move(o.words_)), size_(o.size_) {
    o.size_ = 0;
  }
  EncodedInputs& operator=(EncodedInputs&& o) noexcept {
    words_ = std::move(o.words_);
    size_ = o.size_;
    o.size_ = 0;
    return *this;
  }

  // Empty `bytes` gives an empty EncodedInputs (no inputs). Otherwise invalid_argument with the
  // reason when they are not a valid InputList or its inputs break a rule.
  static Error from(std::string_view bytes, EncodedInputs* out);

  bool empty() const { return size_ == 0; }
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data()), size_}; }

 private:
  friend struct detail::EncodedInputsAccess;
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(words_.get()); }
  void assign(const uint8_t* p, std::size_t n) {
    words_.reset(n ? new uint64_t[(n + 7) / 8] : nullptr);
    if (n) std::memcpy(words_.get(), p, n);
    size_ = n;
  }
  std::unique_ptr<uint64_t[]> words_;  // uint64_t: 8-byte aligned
  std::size_t size_ = 0;
};

// One evaluation of a batch: `inputs`, or `encoded` when it is not empty (then `inputs` is
// ignored).
struct Request {
  Script script;
  Inputs inputs;
  EncodedInputs encoded = {};
};
// Called exactly once per request of a batch, with the request's index.
using BatchCallback = std::function<void(std::size_t index, Result result)>;

// Limits on what a caller may send, checked before anything is queued.
inline constexpr std::size_t kMaxKeySize = 256;
inline constexpr std::size_t kMaxSourceSize = 1u << 20;  // 1 MiB of Lua source

// A key that starts with this byte (NUL) is in the runner's internal namespace: the tags engine's
// scripts ("\0tag:ID", tags::Engine). outrund refuses such keys from its clients, so no client
// can name, replace or unregister them (design/daemon.md "Who owns a key"); outrun::Client sends
// them without the byte (a client's engine's scripts are that client's keys in the daemon). The
// script's chunk name, which error messages show ("tag:ID:3: ..."), leaves the byte out.
inline constexpr char kInternalKeyPrefix = '\0';
inline bool is_internal_key(std::string_view key) {
  return !key.empty() && key.front() == kInternalKeyPrefix;
}
// How errors name a key's script: the key without kInternalKeyPrefix.
inline std::string_view chunk_name_of(std::string_view key) {
  return is_internal_key(key) ? key.substr(1) : key;
}
inline constexpr std::size_t kMaxInputs = 4096;

class Runner {
 public:
  virtual ~Runner() = default;

  // Registers (or replaces) a script under `key`. Computes its SHA-256 once, here. Replacing a
  // key with new source gives a new handle; handles to the old source keep working (Host,
  // InProcess; outrund retires them, see design/daemon.md) and the old record is freed once no
  // handle and no evaluation uses it.
  virtual Error register_script(std::string_view key, std::string_view source, Script* out) = 0;

  // Removes `key` from the registry: afterwards the key can be registered again (a fresh
  // record), evaluations of any handle to it end `invalid_argument` ("script 'KEY' was
  // unregistered"), evaluations already accepted finish normally, and its memory (here and in
  // the workers) is freed once the last handle and evaluation let go. Unknown key:
  // `invalid_argument`.
  virtual Error unregister_script(std::string_view key) = 0;

  // Evaluates `script` with `inputs`; `done` is called exactly once.
  virtual void evaluate(const Script& script, Inputs inputs, Callback done) = 0;

  // Same, as a future (Future above). Fulfilling the future runs no caller code.
  virtual Future evaluate(const Script& script, Inputs inputs) = 0;

  // Same, waiting for the result on the calling thread. By default
  // `evaluate(script, inputs).get()`. Host: the waiting caller reads its shard's results itself
  // when no one else does (leader/follower; one host wake-up per round trip). InProcess: runs it
  // here. It blocks: called from a Host callback, it holds up that dispatcher's other callbacks.
  virtual Result evaluate_sync(const Script& script, Inputs inputs) {
    return evaluate(script, std::move(inputs)).get();
  }

  // Many evaluations in one call, written to each shard as few frames as possible. `done` is
  // called once per request, with its index, in no particular order.
  virtual void evaluate_batch(std::vector<Request> requests, BatchCallback done) = 0;
};

}  // namespace outrun
