// The worker process's serving loop: frames in, evaluations, frames out.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/status_page.h"
#include "outrun/protocol/worker_exit.h"
#include "sandbox.h"

namespace outrun::worker {

// Test-only misbehaviour, enabled by OUTRUN_TEST_FAULT in the worker's environment (never set in
// production; the host does not set it): a comma-separated list of the names below. Lets tests and
// `outrun drill` drive the host's recovery paths with a real worker. Bits of
// WorkerOptions::faults.
enum TestFault : uint32_t {
  kFaultForgetScripts = 1u << 0,   // "forget-scripts": drop every compiled script after each
                                   // batch -> NeedSource
  kFaultNeedSourceLoop = 1u << 1,  // "need-source-loop": answer NeedSource to every evaluation,
                                   // even with source
  // "escape": an evaluation with a string input named "escape" first tries what it names, after
  // confinement: "open", "socket", "fork", "exec", "mmap-exec", "kill-host" (each must be killed
  // by the seccomp filter), or "blow-up" (allocates outside every script's account until the
  // address-space backstop makes it fail).
  kFaultEscape = 1u << 2,
  // "garbage": an evaluation with a string input named "garbage" makes the worker write what it
  // names to the host, then stop serving until it is killed: "bad-length" (a size prefix past
  // the frame limit), "bad-flatbuffer" (a well-sized frame that fails verification),
  // "unknown-id" (a result for an evaluation it was never sent), "duplicate" (two answers to
  // it, the first a RuntimeError), "bad-status" (a status only the host may give),
  // "unknown-status" (a status no build of outrun knows). The host must take each for a protocol
  // violation.
  kFaultGarbage = 1u << 3,
  // "crash-on-source=MARKER": an evaluation that carries a source containing MARKER makes the
  // worker raise SIGSEGV as it starts running it (the evaluation is on the status page), like an
  // interpreter bug the script reaches: the crash-attribution path. Every worker sees a source
  // it does not hold, so the crash repeats on each new worker. WorkerOptions::crash_on_source.
  kFaultCrashOnSource = 1u << 4,
  // "crash-at-start=PATH" is handled in main.cpp: while PATH exists, the worker exits 70
  // (WorkerExit::kTestFault) before it says hello (a worker that cannot start: the crash-loop
  // path).
};
// Parses OUTRUN_TEST_FAULT's list into `faults`, the crash-on-source marker and the
// crash-at-start path; false (with the offending name in *err) for a name it does not know.
bool parse_test_faults(std::string_view list, uint32_t* faults, std::string* crash_on_source,
                       std::string* crash_at_start, std::string* err);

// HostOptions::worker_script_budget's default (the reason is written there).
inline constexpr std::size_t kDefaultScriptBudget = std::size_t{192} << 20;

struct WorkerOptions {
  int fd = 3;       // frames from the host arrive here (a stream socket, blocking)
  int out_fd = -1;  // results go to the host here; -1: the same socket as `fd`
  uint32_t faults = 0;  // TestFault bits
  std::string crash_on_source;           // kFaultCrashOnSource: the marker
  std::size_t memory_limit = 16u << 20;  // per script state
  // All script states together (HostOptions::worker_script_budget): least recently used idle
  // states are closed to stay under it (design/sandbox.md, "The worker's script budget").
  std::size_t script_budget = kDefaultScriptBudget;
  protocol::StatusPage* page = nullptr;  // shared with the host; may be null (tests)
};

// Exit codes: protocol::WorkerExit (the host reads them to tell causes apart).
using protocol::exit_code;
using protocol::WorkerExit;

// Serves the host until it closes the pipe or sends Shutdown. Single-threaded: reads every
// frame that has arrived, runs the evaluations in order, and answers with one write per batch
// (or sooner when results have waited kMaxResultHoldNs).
class Worker {
 public:
  explicit Worker(const WorkerOptions& options);
  int run();

 private:
  // Recency of the scripts held: an intrusive circular list through a sentinel, most recently
  // evaluated first, so that touching and evicting are O(1).
  struct LruLink {
    LruLink* next = this;  // towards less recently used
    LruLink* prev = this;  // towards more recently used
  };
  struct Script : LruLink {
    uint32_t id = 0;
    std::array<uint8_t, 32> sha256{};
    std::unique_ptr<sandbox::ScriptState> state;
    sandbox::Outcome compile_outcome;  // Ok, or why it cannot run (kept: compile once)
  };

  bool send_hello();
  void handle(const wire::Frame* frame);
  void evaluate(const wire::Evaluation* e);
  bool test_fault(const wire::Evaluation* e);  // true: `e` is dealt with
  bool write_garbage(const wire::Evaluation* e, std::string_view what);  // kFaultGarbage
  void mark_running(uint64_t id);  // on the status page: T counts from now
  Script* script_for(const wire::Evaluation* e);
  void touch(Script* s);          // most recently used now
  void drop_script(uint32_t id);  // closes its state; its next evaluation answers NeedSource
  // Closes least recently used states until the budget's bytes are at most `target`, never the
  // state whose account is `keep`; true when they are.
  bool evict_down_to(std::size_t target, const sandbox::MemoryAccount* keep);
  static bool reclaim(void* self, const sandbox::MemoryAccount* asking, std::size_t bytes);
  void add_result(uint64_t id, wire::Status status, flatbuffers::Offset<wire::Value> value,
                  std::string_view error);
  bool flush();
  bool write_all(const uint8_t* data, std::size_t size);

  WorkerOptions opts_;
  protocol::FrameReader reader_;
  flatbuffers::FlatBufferBuilder out_{64 * 1024};
  std::vector<flatbuffers::Offset<wire::Result>> results_;
  int64_t first_result_ns_ = 0;
  int64_t now_ns_ = 0;  // read once per evaluation: its start (T), the batch hold, the page
  // Declared before scripts_: every state charges it, until its destructor has run.
  sandbox::ScriptBudget budget_;
  std::size_t evict_above_ = 0;  // budget - headroom: checked before each evaluation
  LruLink lru_;                  // sentinel; lru_.next is the most recently used script
  std::vector<std::unique_ptr<Script>> scripts_;  // by script_id
  bool shutdown_ = false;
  bool io_failed_ = false;
};

// Results are held for a batch write at most this long while more evaluations run.
inline constexpr int64_t kMaxResultHoldNs = 1'000'000;
// Results are written once this many bytes are batched (keeps every frame < kMaxFrameSize).
inline constexpr std::size_t kFlushBytes = 4u << 20;
// Highest script id a worker accepts (bounds the table it keeps).
inline constexpr uint32_t kMaxScriptId = 1u << 22;

}  // namespace outrun::worker
