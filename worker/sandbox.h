// The Lua 5.4 sandbox: one isolated lua_State per script. Shared by outrun-worker and the
// InProcess runner, so both run scripts identically.
//
// Rule for every C function that Lua calls (and for the trampolines here): Debian's Lua is built
// as C, so a Lua error is a longjmp. Nothing with a destructor may be alive on the C++ stack
// between a Lua API call that can raise and the end of the protected call. See design/sandbox.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outrun/protocol/outrun_generated.h"

struct lua_State;

namespace outrun::sandbox {

using wire::Status;

// Instructions between two checks of the soft deadline by the count hook.
inline constexpr int kHookInterval = 1000;

struct MemoryAccount;

// Bytes all the script states of one worker may hold together (the worker's script memory
// budget, design/sandbox.md). Every state created with it charges its allocations here as well
// as to its own account. Single-threaded, like the states.
struct ScriptBudget {
  std::size_t used = 0;   // live bytes of all states charged to it
  std::size_t limit = 0;  // growth past it is refused unless `reclaim` makes room
  // Called by the allocator of the state whose account is `asking` when growing by `bytes` would
  // pass `limit`: frees other (idle) states until the growth fits, and says whether it does now.
  // It must not touch `asking`'s state. May be null (then the growth is refused).
  bool (*reclaim)(void* ctx, const MemoryAccount* asking, std::size_t bytes) = nullptr;
  void* reclaim_ctx = nullptr;
};

// Lua's allocator for one script state: counts live bytes and refuses growth past `limit`
// (frees and shrinks always succeed), which Lua reports as LUA_ERRMEM.
struct MemoryAccount {
  std::size_t used = 0;
  std::size_t peak = 0;
  std::size_t limit = 0;
  // Fault injection for tests: fail the allocation whose running number (`allocations`, counted
  // from the state's creation) is `fail_at` (0 = never).
  uint64_t fail_at = 0;
  uint64_t allocations = 0;
  bool system_refused = false;     // the allocator itself failed (RLIMIT_AS backstop), in this run
  ScriptBudget* budget = nullptr;  // the worker's budget, charged too; null: none (InProcess)
  bool budget_refused = false;     // the budget refused growth (nothing left to reclaim), this run
};

// What print(...) and log.debug/info/warn/error(...) record during one run (design/sandbox.md
// "Script logs"): at most `max_lines` lines (<= kMaxLogLinesPerEvaluation) and
// kMaxLogBytesPerEvaluation bytes of escaped text; calls past them only count `dropped`. Owned by
// the runner and reused: its storage is reserved once, so recording a line never allocates (an
// allocation failure would be a C++ exception inside Lua's C frames).
struct ScriptLog {
  struct Line {
    uint8_t level = 1;  // wire::LogLevel
    std::string text;
  };
  ScriptLog();
  // Forgets the last run's lines; this run may keep at most `max` (the runner's rate limit).
  void reset(std::size_t max);
  std::vector<Line> lines;  // lines[0, count) are this run's
  std::size_t count = 0;
  std::size_t bytes = 0;
  std::size_t max_lines = 0;
  uint32_t dropped = 0;
};

// Per-evaluation state the count hook reads through the lua_State's extra space.
struct RunContext {
  // Where print and log.* record during run() (null outside it, and when the runner keeps no
  // log: then they do nothing).
  ScriptLog* log = nullptr;
  int64_t deadline_ns = 0;  // CLOCK_MONOTONIC
  bool timed_out = false;
  // How many coroutine.close calls are running, nested inside one another (through __close
  // handlers): Lua 5.4.4 does not count them against its C-stack limit (bug 5.4.4-9).
  int close_depth = 0;
  // The C stack's position when the evaluation started (0: none running): coroutine.close also
  // refuses once the evaluation has used kMaxCloseStack bytes of C stack, since each nested close
  // lets its handler nest up to LUAI_MAXCCALLS C calls again.
  uintptr_t stack_base = 0;
};

struct Outcome {
  Status status = Status::Ok;
  std::string error;
};

// Reads the evaluation's inputs into a Lua table. Called inside a protected call with the table
// on the top of the stack; it may raise Lua errors (allocation failure) and must follow the rule
// above. Returns false (after pushing nothing) to reject the inputs as invalid.
using PushInputsFn = bool (*)(lua_State* L, const void* inputs);

class ScriptState {
 public:
  // Creates the state with the sandboxed libraries. Fails (nullptr, *error set) only when
  // `memory_limit` (or `budget`, which must outlive the state) is too small to hold them.
  static std::unique_ptr<ScriptState> create(std::size_t memory_limit, std::string* error,
                                             ScriptBudget* budget = nullptr);
  ~ScriptState();
  ScriptState(const ScriptState&) = delete;
  ScriptState& operator=(const ScriptState&) = delete;

  // Compiles `source` as a text chunk named `chunk_name` (Lua's "=name" convention: errors read
  // "name:LINE: message"). On failure: CompileError or MemoryLimit, with the message.
  Outcome compile(std::string_view source, const std::string& chunk_name);
  bool compiled() const { return compiled_; }

  // The compiled chunk as Lua bytecode (lua_dump with its debug information, so errors keep
  // their line numbers), appended to `out`; false when not compiled or out of memory. For this
  // process's own use only: load_chunk() into another state of the same process, never bytecode
  // from anywhere else (design/sandbox.md "Bytecode stays in its worker").
  bool dump_chunk(std::string* out);
  // Loads what dump_chunk() gave (binary chunks only) as this state's compiled chunk.
  Outcome load_chunk(std::string_view bytecode);

  // Runs the compiled chunk with `inputs` (via push_inputs) as the global `inputs`. On Ok the
  // returned value is on the top of the stack until the next call; convert it with
  // lua_values.h. T starts at `start_ns` (CLOCK_MONOTONIC; 0: now), so a caller that already
  // read the clock for this evaluation does not read it again.
  // What the script prints or logs goes to `log` (reset by the caller; null: nowhere).
  Outcome run(PushInputsFn push_inputs, const void* inputs, int64_t timeout_ns,
              int64_t start_ns = 0, ScriptLog* log = nullptr);

  lua_State* L() const { return L_; }
  const MemoryAccount& memory() const { return *account_; }
  MemoryAccount& memory_for_tests() { return *account_; }

 private:
  ScriptState() = default;
  Outcome load(std::string_view text, const char* chunk_name, const char* mode);
  std::unique_ptr<MemoryAccount> account_;
  std::unique_ptr<RunContext> ctx_;
  lua_State* L_ = nullptr;
  bool compiled_ = false;
  std::string timeout_message_;
};

int64_t monotonic_ns();

// The Lua chunk name of a script named `key` (Lua's "=name": errors read "key:LINE: ..."); a
// script sent without a name is "script". The worker and the compile-only process both use it,
// so a script's bytecode names it as the worker's own compile would.
inline std::string chunk_name_for(std::optional<std::string_view> key) {
  return key ? "=" + std::string(*key) : std::string("=script");
}

}  // namespace outrun::sandbox
