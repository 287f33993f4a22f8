// outrun::tags: virtual tags with OPC UA DataValue semantics on top of any outrun::Runner
// (Host, InProcess or Client). Semantics, the script environment and the file format:
// design/tags.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outrun/runner.h"
#include "outrun/value.h"

namespace outrun::tags {

// ---- OPC UA StatusCodes (OPC 10000-4 7.39, numeric values from OPC 10000-6 / the NodeSet) ----

using StatusCode = uint32_t;

namespace codes {
inline constexpr StatusCode Good = 0x00000000;
inline constexpr StatusCode Uncertain = 0x40000000;
inline constexpr StatusCode UncertainLastUsableValue = 0x40900000;
inline constexpr StatusCode UncertainSubstituteValue = 0x40910000;
inline constexpr StatusCode UncertainInitialValue = 0x40920000;
inline constexpr StatusCode UncertainSensorNotAccurate = 0x40930000;
inline constexpr StatusCode UncertainEngineeringUnitsExceeded = 0x40940000;
inline constexpr StatusCode Bad = 0x80000000;
inline constexpr StatusCode BadInternalError = 0x80020000;
inline constexpr StatusCode BadOutOfMemory = 0x80030000;
inline constexpr StatusCode BadResourceUnavailable = 0x80040000;
inline constexpr StatusCode BadTimeout = 0x800A0000;
inline constexpr StatusCode BadTooManyOperations = 0x80100000;
inline constexpr StatusCode BadNoCommunication = 0x80310000;
inline constexpr StatusCode BadWaitingForInitialData = 0x80320000;
inline constexpr StatusCode BadNodeIdUnknown = 0x80340000;
inline constexpr StatusCode BadOutOfRange = 0x803C0000;
inline constexpr StatusCode BadTypeMismatch = 0x80740000;
inline constexpr StatusCode BadConfigurationError = 0x80890000;
inline constexpr StatusCode BadInvalidArgument = 0x80AB0000;
inline constexpr StatusCode BadSensorFailure = 0x808C0000;
inline constexpr StatusCode BadDeviceFailure = 0x808B0000;
}  // namespace codes

enum class Severity : uint8_t { good = 0, uncertain = 1, bad = 2 };
// The top two bits: 00 Good, 01 Uncertain, 10 (and 11, reserved) Bad.
inline Severity severity(StatusCode c) {
  const uint32_t s = c >> 30;
  return s == 0 ? Severity::good : s == 1 ? Severity::uncertain : Severity::bad;
}
// "Good", "BadTimeout", ...; for a code without a known name, "0x80AB0000".
std::string status_code_name(StatusCode c);
// A known name, "0x..." hex or a decimal number.
bool parse_status_code(std::string_view text, StatusCode* out);

// The StatusCode an evaluation's outcome becomes (design/tags.md "Error -> StatusCode").
StatusCode status_code_for(Status s);

// An OPC UA DataValue.
struct DataValue {
  Value value;
  StatusCode status = codes::BadWaitingForInitialData;
  DateTime source_time;
  DateTime server_time;
  std::string diagnostics;  // why, when the status is not Good because of an error
  // Same value, same status and same source timestamp: no change (server_time and diagnostics are
  // not compared). NaN is the same as NaN here (OPC UA Part 4 7.10: one notification when a value
  // enters the NaN state, not one per update).
  bool same_as(const DataValue& o) const;
};

// Value equality for change detection: as operator==, except that a NaN equals a NaN (Double and
// Float, also inside arrays and maps).
bool same_value(const Value& a, const Value& b);

// The InfoBits of a DataValue's StatusCode (OPC 10000-4 7.39): InfoType DataValue (0x400) with the
// Overflow bit (0x80), set on the first value after updates were merged or dropped.
inline constexpr uint32_t kOverflowBits = 0x00000480;

// ---- Definitions ----

// The OPC UA built-in types a tag's value can have (OPC 10000-6 5.1.2).
enum class DataType : uint8_t {
  Variant = 0,  // whatever the script returns (no coercion)
  Boolean,
  SByte,
  Byte,
  Int16,
  UInt16,
  Int32,
  UInt32,
  Int64,
  UInt64,
  Float,
  Double,
  String,
  DateTime,
  ByteString,
};
std::string_view to_string(DataType t);
bool parse_data_type(std::string_view name, DataType* out);

struct TypeSpec {
  DataType type = DataType::Double;
  bool array = false;  // a one-dimensional array of `type` (ValueRank 1)
  friend bool operator==(const TypeSpec&, const TypeSpec&) = default;
};

// Coerces a script's result to `spec`. On failure returns BadTypeMismatch or BadOutOfRange and
// sets *reason.
StatusCode coerce(const Value& in, TypeSpec spec, Value* out, std::string* reason);

enum class DeadbandKind : uint8_t { none, absolute, percent };

struct InputSpec {
  std::string tag;      // a source tag or another virtual tag
  std::string name;     // what the script calls it (inputs[name]); empty: the tag id
  bool trigger = true;  // on_change: a change of this input triggers an evaluation
  DeadbandKind deadband = DeadbandKind::none;
  double deadband_value = 0;
  // Percent deadbands are a percentage of this range (OPC UA's EURange); when both are 0, of the
  // magnitude of the value the tag last used.
  double range_low = 0, range_high = 0;
  friend bool operator==(const InputSpec&, const InputSpec&) = default;
};

enum class TriggerKind : uint8_t { on_change, periodic, on_read, manual };

struct Trigger {
  TriggerKind kind = TriggerKind::on_change;
  std::chrono::milliseconds period{1000};  // periodic: fixed rate
  std::chrono::milliseconds max_age{0};    // on_read: a read of an older value evaluates first
  friend bool operator==(const Trigger&, const Trigger&) = default;
};

enum class TimestampPolicy : uint8_t {
  newest_input,      // the newest source timestamp among the inputs (the default)
  triggering_input,  // the newest among the inputs whose change triggered this evaluation
  evaluation_time,   // the evaluation's time
};

struct TagDefinition {
  std::string id;
  std::string script;  // Lua 5.4, run with the environment of design/tags.md
  std::vector<InputSpec> inputs;
  TypeSpec type;
  Trigger trigger;
  TimestampPolicy timestamps = TimestampPolicy::newest_input;
  // `state` survives a worker restart: the worker returns it with each result (at most
  // max_state_bytes) and a restarted worker starts from it. Off: it is lost with the worker.
  bool keep_state = false;
  // On a redefinition: start the new script with an empty `state` instead of the old one's.
  bool reset_state = false;
  std::size_t max_state_bytes = 64u << 10;
  // While its worker is down, the tag shows UncertainLastUsableValue with its last good value
  // for this long, then BadResourceUnavailable.
  std::chrono::milliseconds last_usable{10000};
  // A Bad input (or one never written) is passed to the script (true), or the tag is not evaluated
  // and takes that input's status with no value (false, the default; design/tags.md).
  bool evaluate_bad_inputs = false;
  // Every update of an input is evaluated in order (a bounded queue, TagsOptions::max_update_queue)
  // instead of the latest one per wave.
  bool every_update = false;

  // Where the definition came from, for errors: "FILE:LINE:COL" of its [[tag]] table ("" if not
  // from a file), and where the script's first line is (a Lua error's line N is line
  // script_line + N - 1 of script_origin). Not part of the definition: a reload that only moves a
  // tag in its file leaves it alone.
  std::string location;
  std::string script_origin;
  int script_line = 0;
  // Set by the tags file's reader when the definition is broken (an unknown DataType, a bad key):
  // the tag exists with BadConfigurationError and this reason (Engine::apply, not strict).
  std::string config_error;
};

// Same script, inputs, type, triggers and options (location and script_origin are not compared).
bool same_definition(const TagDefinition& a, const TagDefinition& b);

// Limits on what the engine accepts, checked before anything changes.
inline constexpr std::size_t kMaxTagIdSize = 256;
inline constexpr std::size_t kMaxTagInputs = 256;
inline constexpr std::size_t kMaxTags = 1u << 20;  // the most TagsOptions::max_tags may be

// What a source value costs against TagsOptions::max_source_bytes and max_source_value_bytes:
// its strings and byte strings, plus 16 bytes per value (arrays and maps count each element).
std::size_t value_size(const Value& v);

struct SourceUpdate {
  std::string tag;
  DataValue value;  // value, status, source_time (server_time is set by the engine)
};

struct Change {
  std::string tag;
  DataValue value;
};

// Called with the changes of one wave, in the graph's topological order. Never called
// concurrently with itself; waves are delivered in the order they completed. It runs on the
// thread that completed the wave (a Host's dispatcher thread, or the caller's for InProcess) and
// must not call define/remove/apply or an on-read read (they wait for waves to finish).
using ChangeCallback = std::function<void(const std::vector<Change>& changes)>;

struct TagCounters {
  uint64_t evaluations = 0;
  uint64_t by_status[11] = {};  // by outrun::Status
  uint64_t coalesced = 0;       // triggers merged into a later evaluation
  uint64_t busy = 0;            // evaluations refused by single flight (not outputs)
  uint64_t changes = 0;         // notified output changes
  uint64_t state_restores = 0;  // keep_state: a restarted worker asked for the kept state
  uint64_t overflows = 0;       // values published with the Overflow bit (updates merged/dropped)
  uint64_t skipped_bad = 0;     // triggers not evaluated because an input was Bad
  std::string last_error;
  // What outrund's state store says of this tag: its stored row was unusable at start, or its
  // state is not stored (the store's total budget); "" when all is well.
  std::string state_store;
  std::chrono::microseconds last_duration{0};  // submit -> result of the last evaluation
};

struct TagInfo {
  TagDefinition definition;
  DataValue value;
  TagCounters counters;
  uint64_t version = 0;  // 1 on the first definition, +1 per redefinition
};

// ---- State across restarts (design/tags.md "State across restarts") ----

// What a tag left in a state store (outrund's SQLite file) when its process last ran.
struct RestoredTag {
  std::string id;
  DataValue value;  // the last published DataValue; used when has_value and not Bad
  bool has_value = false;
  Value state;  // keep_state: the script's `state` when it was last stored
  bool has_state = false;
  std::string script_sha256;  // hex, of the script that state came from ("": unknown)
  // The stored row could not be used (a checksum, a value that does not decode, a state over
  // the bound): the tag starts from {} and its diagnostics say this.
  std::string problem;
};

// Told every published value and kept state of a virtual tag, and every removal, so that a
// restart of the process finds them again (outrund's state store). Called with the engine's lock
// held, on whatever thread completed the evaluation or the apply: it hands over and returns, and
// never waits for a disk.
class StateSink {
 public:
  virtual ~StateSink() = default;
  // `state`: the kept state (keep_state), or null (none: keep_state off, or not kept yet).
  // `script_sha256`: hex SHA-256 of the script that runs the tag.
  virtual void saved(const std::string& id, const DataValue& value, const Value* state,
                     const std::string& script_sha256) = 0;
  virtual void removed(const std::string& id) = 0;
  // Why the tag's state is not stored right now ("" when it is): TagCounters::state_store.
  virtual std::string note(const std::string& id) = 0;
};

struct TagsOptions {
  ChangeCallback on_change;
  // The evaluation time. Empty: the system clock.
  std::function<DateTime()> clock;
  // Periodic tags are run by the engine's own timer thread (true), or only by advance_clock()
  // (false: the offline runner, tests).
  bool real_time_periodic = true;
  // A tag whose evaluation found its worker down is evaluated again after this long.
  std::chrono::milliseconds retry_delay{50};
  // How long define/apply/remove wait for in-flight waves, and an on-read read for its result.
  std::chrono::milliseconds wait_timeout{10000};
  // Virtual tags the engine holds (at most kMaxTags); an apply() that would hold more is refused.
  std::size_t max_tags = kMaxTags;
  // Source tags (ids updated by update()) the engine keeps; past it updates of new ids fail.
  std::size_t max_sources = 1u << 20;
  // What every source tag holds together (its id, its value, an update waiting for its wave and
  // the every_update queue, as value_size counts them); an update that would pass it is refused.
  std::size_t max_source_bytes = std::size_t{1} << 30;
  // One source value (value_size); a larger one is refused.
  std::size_t max_source_value_bytes = std::size_t{16} << 20;
  // every_update: the updates of one source waiting for their waves; past it the oldest is
  // dropped, counted and flagged (Overflow).
  std::size_t max_update_queue = 1024;
  // Persistence across restarts of the process (outrund's state_dir). Null: none.
  std::shared_ptr<StateSink> state_sink;
  // What the store gave back at start. A tag defined (as new) with one of these ids starts from
  // its state (keep_state; not when the script changed and reset_state) and shows its last value
  // as UncertainLastUsableValue (value and source timestamp kept) until it is next evaluated.
  std::vector<RestoredTag> restored;
  // Given to every tag defined without a restored row (the store was unusable and was set
  // aside): its diagnostics say so. "": none.
  std::string restore_note;
  // What the log rings of all tags hold together (Engine::logs), bytes: past it a tag's new
  // lines replace its own oldest ones.
  std::size_t max_log_bytes = std::size_t{32} << 20;
  // Called with the lines a tag's evaluation logged (outrund: its own log, at debug level), on
  // the thread that completed it and with the engine's lock held: it must not call the engine.
  std::function<void(std::string_view id, const std::vector<LogLine>& lines)> on_log;
  // Observers of one tag's evaluations (`outrun tags test`, design/tags.md "Testing one tag").
  // on_submit sees the inputs an evaluation is about to send (the prelude's `__c` last,
  // host/tags/prelude.h) and may change them; on_result sees each Result as it comes back, its
  // logs included. Both run under the engine's lock: they must not call the engine.
  std::function<void(const std::string& id, Inputs* inputs)> on_submit;
  std::function<void(const std::string& id, const Result& result)> on_result;
};

// Who writes an update (outrund: the connection and its peer uid), for the per-writer bounds.
// A source tag created by an update belongs to its `owner` until a tag uses it as an input;
// forget_sources(owner) frees the ones no tag uses. What sources hold is charged to the uid of
// the last writer of each.
struct UpdateOptions {
  uint64_t owner = 0;  // 0: no owner (the sources it makes are kept: the offline runner, tests)
  uint32_t uid = 0;
  bool may_create = true;  // false: an update of an id that is not a tag yet is refused
  std::size_t max_uid_sources = SIZE_MAX;  // sources `uid` created (still owned by a writer)
  std::size_t max_uid_bytes = SIZE_MAX;    // bytes of the sources whose last writer is `uid`
};

// What the sources hold, in total and per uid (UpdateOptions).
struct SourceUsage {
  std::size_t sources = 0;  // source tags (all, or created by the uid and not used by a tag)
  std::size_t bytes = 0;    // as max_source_bytes counts them
};

// A definition that apply() could not install as given.
struct DefinitionError {
  std::string id;        // "" when the definition has no usable id
  std::string location;  // "FILE:LINE:COL" where known, else ""
  std::string message;   // the reason (a compile error names the file's line when it can)
  ErrorCode code = ErrorCode::invalid_argument;  // compile_error for a script that does not compile
  bool installed = false;  // the tag exists, with BadConfigurationError (not strict)
};

struct ApplyOptions {
  bool replace_all = false;  // tags not in the set are removed (a tags file reload)
  // All or nothing: any broken definition refuses the whole set and nothing changes. Otherwise
  // a broken definition becomes a tag with BadConfigurationError and every other one is applied.
  bool strict = false;
};

struct ApplyResult {
  std::vector<std::string> defined;    // new or changed (evaluated once)
  std::vector<std::string> unchanged;  // left alone
  std::vector<std::string> removed;
  std::vector<DefinitionError> errors;  // every broken definition, in the order given
};

// Counted over the engine's life (the sums of every tag's TagCounters, removed tags included),
// and two gauges of the moment.
struct EngineCounters {
  uint64_t waves = 0;
  uint64_t source_updates = 0;
  uint64_t evaluations = 0;
  uint64_t by_status[11] = {};  // evaluations by outrun::Status of their result
  uint64_t changes = 0;
  uint64_t coalesced = 0;
  uint64_t busy = 0;
  uint64_t overflows = 0;
  uint64_t skipped_bad = 0;
  std::chrono::microseconds last_wave{0};  // start -> end of the last wave that ended
  std::size_t waves_waiting = 0;           // gauge: components with a wave running or due
};

class Engine {
 public:
  // `runner` must outlive the engine.
  static Error create(Runner& runner, TagsOptions options, std::unique_ptr<Engine>* out);
  // Waits for in-flight evaluations; unregisters the engine's scripts.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Defines or redefines tags and removes others, as one atomic step: every new script is
  // compiled (in the runner's workers) before anything changes; on any error nothing changes
  // and the error names the tag (and the cycle's path, for a cycle). `replace_all`: tags not in
  // `defs` are removed (a tags file reload).
  Error apply(const std::vector<TagDefinition>& defs, bool replace_all = false);
  // As above with the choice of strictness. Not strict: a definition that does not compile, names
  // an unknown DataType (config_error), fails a check or closes a cycle becomes a tag with status
  // BadConfigurationError (no value, diagnostics "LOCATION: reason"), and the others are applied;
  // the error returned is then only for what stops the whole set (closing, a wait timeout, the
  // runner unavailable). A definition equal to the running one (same_definition) is left alone:
  // no evaluation, no version change, its state and timers untouched. `result` may be null.
  Error apply(const std::vector<TagDefinition>& defs, const ApplyOptions& options,
              ApplyResult* result);
  Error define(const TagDefinition& def) { return apply({def}); }
  // Removes a tag; refused while another tag uses it as an input.
  Error remove(std::string_view id);

  // One wave: the updates are applied together and every affected tag is evaluated at most once,
  // in topological order, seeing all of them. `time` is the evaluation time (default: clock).
  Error update(const std::vector<SourceUpdate>& updates);
  Error update(const std::vector<SourceUpdate>& updates, DateTime time);
  // With a writer's bounds (outrund); the engine's clock.
  Error update(const std::vector<SourceUpdate>& updates, const UpdateOptions& options);
  // Frees the source tags `owner` created that no tag uses (outrund: a connection closed).
  // Returns how many.
  std::size_t forget_sources(uint64_t owner);
  // Total and per-uid usage of the sources (uid: only the sources it wrote last).
  SourceUsage source_usage() const;
  SourceUsage source_usage(uint32_t uid) const;

  // The current DataValue of a tag (virtual or source). An on_read tag whose value is older
  // than its max_age is evaluated first (this call then waits for it).
  Error read(std::string_view id, DataValue* out);
  // As read(), but never waits: when the tag would be evaluated first, *out is left as it is and
  // *would_wait is set (read() it then where waiting is allowed; outrund's loop cannot wait).
  Error read_now(std::string_view id, DataValue* out, bool* would_wait);
  // Manual (or any) trigger: evaluate the tag in a new wave.
  Error trigger(std::string_view id);
  // Offline mode: runs the periodic tags due at `t` (each at most once) and sets the clock.
  void advance_clock(DateTime t);

  // Waits until no wave is running or queued (tests, the offline runner).
  bool wait_idle(std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

  Error info(std::string_view id, TagInfo* out) const;
  // A virtual tag's recent log lines (what its script printed or logged; LogPage in runner.h):
  // those numbered `since` and after (0: the oldest kept), at most `limit` (0: all). Each tag
  // keeps its last 64 lines, all tags together at most TagsOptions::max_log_bytes.
  Error logs(std::string_view id, uint64_t since, std::size_t limit, LogPage* out) const;
  std::vector<std::string> ids() const;  // virtual tags, in topological order
  // One page of the virtual tags in topological order: those after the tag `after` ("" from the
  // first), at most `limit`, and no more once their values and inputs pass `max_bytes` (at least
  // one). definition.script is left empty. *more: tags follow. `after` no longer a virtual tag:
  // invalid_argument. The order holds while no definition changes between two pages.
  Error page(std::string_view after, std::size_t limit, std::size_t max_bytes,
             std::vector<TagInfo>* out, bool* more) const;
  std::size_t size() const;                  // virtual tags
  bool contains(std::string_view id) const;  // a virtual or a source tag
  // read() of it would evaluate it first (an on_read tag older than its max_age); no copy.
  bool read_would_wait(std::string_view id) const;
  EngineCounters counters() const;

  struct Impl;

 private:
  explicit Engine(std::shared_ptr<Impl> impl);
  Error update_at(const std::vector<SourceUpdate>& updates, DateTime time,
                  const UpdateOptions& options);
  std::shared_ptr<Impl> impl_;  // shared with evaluations still in flight
};

}  // namespace outrun::tags
