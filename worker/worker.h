// The worker process's serving loop: frames in, evaluations, frames out.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hooks.h"
#include "outrun/platform/worker_os.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/status_page.h"
#include "outrun/protocol/worker_exit.h"
#include "sandbox.h"

namespace outrun::worker {

// HostOptions::worker_script_budget's default (the reason is written there).
inline constexpr std::size_t kDefaultScriptBudget = std::size_t{192} << 20;

// POSIX: fd 3, where the host puts the worker's end; Windows: none (--fd names a handle).
#ifdef _WIN32
inline const platform::Channel kDefaultChannel = platform::kNoChannel;
#else
inline constexpr platform::Channel kDefaultChannel = 3;
#endif

struct WorkerOptions {
  // Frames from the host arrive here (blocking: a stream socket, a named pipe).
  platform::Channel fd = kDefaultChannel;
  // Results go to the host here; kNoChannel: the same channel as `fd`.
  platform::Channel out_fd = platform::kNoChannel;
  std::size_t memory_limit = 16u << 20;  // per script state
  // All script states together (HostOptions::worker_script_budget): least recently used idle
  // states are closed to stay under it (design/sandbox.md, "The worker's script budget").
  std::size_t script_budget = kDefaultScriptBudget;
  protocol::StatusPage* page = nullptr;  // shared with the host; may be null (tests)
  const Hooks* hooks = nullptr;          // a test build's (hooks.h); null in outrun-worker
};

// Exit codes: protocol::WorkerExit (the host reads them to tell causes apart).
using protocol::exit_code;
using protocol::WorkerExit;

// Fresh script states the worker keeps ready, made while it waits for input (design/sandbox.md,
// "The worker's script budget"). 16 absorbs a burst of 16 evaluations that each need a new state
// (a new script, or one whose state was evicted) in one frame or back to back; it costs ~170 KB
// of the budget (a bare state holds ~10.5 KB), 0.1 % of the default, and ~16 x 20 us of idle
// time to fill, checked for input before each. More would take room from the scripts' states
// for bursts that a paced load rarely has (at 10k/s over two workers, ~200 us between them).
inline constexpr std::size_t kSpareStates = 16;

// Serves the host until it closes the pipe or sends Shutdown. Single-threaded: reads every
// frame that has arrived, runs the evaluations in order, and answers with one write per batch
// (or sooner when results have waited kMaxResultHoldNs).
// Sends all of `data` on `fd` (platform::channel_write_all); false when the channel failed.
bool send_all(platform::Channel fd, std::span<const uint8_t> data);

class Worker {
 public:
  explicit Worker(const WorkerOptions& options);
  int run();

  // What the hooks of a test build (hooks.h) may do besides evaluating.
  void answer(uint64_t id, wire::Status status, std::string_view error) {  // queues a result
    add_result(id, status, 0, error);
  }
  bool flush();                    // writes the queued results
  void mark_running(uint64_t id);  // on the status page: T counts from now
  bool write_raw(const uint8_t* data, std::size_t size) { return write_all(data, size); }
  void drop_all_scripts() {  // as though the host had forgotten every one
    for (uint32_t id = 0; id < scripts_.size(); ++id)
      if (scripts_[id]) drop_script(id);
  }
  struct PoolCounts {
    std::size_t spares = 0;   // fresh states ready now
    std::size_t closing = 0;  // evicted states whose close waits for idle time
    uint64_t made = 0;        // spares made since the worker started
    uint64_t taken = 0;       // spares given to a script (new, or reloaded from bytecode)
  };
  PoolCounts pool_counts() const {
    return {spares_.size(), closing_.size(), spares_made_, spares_taken_};
  }

 private:
  // Recency of the scripts held: an intrusive circular list through a sentinel, most recently
  // evaluated first, so that touching and evicting are O(1).
  struct LruLink {
    LruLink* next = this;  // towards less recently used
    LruLink* prev = this;  // towards more recently used
    // Out of whichever list holds it, linked to itself (unlinking it again changes nothing).
    void unlink() {
      prev->next = next;
      next->prev = prev;
      next = prev = this;
    }
    // First in the list of sentinel `head`.
    void push_front(LruLink* head) {
      next = head->next;
      prev = head;
      head->next->prev = this;
      head->next = this;
    }
  };
  // A script the host sent. Held one of two ways: with its state (in lru_), or, once its state
  // was evicted, as the bytecode of its compiled chunk (in chunks_; a new state loads it on the
  // script's next evaluation instead of the host re-sending and the worker compiling the source).
  struct Script : LruLink {
    uint32_t id = 0;
    std::array<uint8_t, 32> sha256{};
    std::unique_ptr<sandbox::ScriptState> state;
    sandbox::Outcome compile_outcome;  // Ok, or why it cannot run (kept: compile once)
    std::string chunk;                 // lua_dump of its chunk, while it has no state
    // Its log rate limit (design/sandbox.md "Script logs"): lines it may still log, refilled
    // at kLogLinesPerSecond up to kLogBurst, as of log_refill_ns.
    double log_tokens = kLogBurst;
    int64_t log_refill_ns = 0;
  };
  static constexpr double kLogLinesPerSecond = 50;
  static constexpr double kLogBurst = 100;
  // The lines `s` may log in the evaluation starting now (its bucket refilled).
  std::size_t log_allowance(Script* s);

  bool send_hello();
  void handle(const wire::Frame* frame);
  void evaluate(const wire::Evaluation* e);
  Script* script_for(const wire::Evaluation* e);
  void touch(Script* s);          // most recently used now
  void drop_script(uint32_t id);  // closes its state; its next evaluation answers NeedSource
  // Closes its state and keeps its chunk's bytecode (in chunks_), or drops it when that fails.
  // `defer`: the state goes to closing_ instead, closed while the worker is idle.
  void evict_state(Script* s, bool defer);
  // Builds its state again from its bytecode (evict_state); false: it was dropped instead.
  bool reload(Script* s);
  // Frees room until the budget's bytes are at most `target`: the states waiting in closing_,
  // then the spares, then least recently used states, never the state whose account is `keep`;
  // true when they are. `defer` (before an evaluation): states are moved to closing_ rather than
  // closed, their bytes and the spares' count as room (the allocator's reclaim frees both for
  // real), and spares are kept.
  bool evict_down_to(std::size_t target, const sandbox::MemoryAccount* keep, bool defer);
  static bool reclaim(void* self, const sandbox::MemoryAccount* asking, std::size_t bytes);
  // A fresh state for a script: a spare when there is one, else a new one.
  std::unique_ptr<sandbox::ScriptState> new_state(std::string* err);
  void close_later(std::unique_ptr<sandbox::ScriptState> state);
  void close_one_deferred();
  // While no input waits: closes the deferred states, then makes spares into free room.
  void idle();
  bool input_waiting() const;
  void add_result(uint64_t id, wire::Status status, flatbuffers::Offset<wire::Value> value,
                  std::string_view error);
  bool write_all(const uint8_t* data, std::size_t size);

  WorkerOptions opts_;
  protocol::FrameReader reader_;
  protocol::HotBuilder out_{64 * 1024};
  std::vector<flatbuffers::Offset<wire::Result>> results_;
  sandbox::ScriptLog log_;  // the running evaluation's print/log lines (add_result sends them)
  int64_t first_result_ns_ = 0;
  int64_t now_ns_ = 0;  // read once per evaluation: its start (T), the batch hold, the page
  // Declared before scripts_: every state charges it, until its destructor has run.
  sandbox::ScriptBudget budget_;
  std::size_t evict_above_ = 0;  // budget - headroom: checked before each evaluation
  LruLink lru_;                  // sentinel; lru_.next is the most recently used script
  LruLink chunks_;               // sentinel of the evicted scripts, most recently evicted first
  std::size_t chunk_bytes_ = 0;  // their bytecode (at most script_budget / 4)
  std::vector<std::unique_ptr<Script>> scripts_;  // by script_id
  // Fresh states that never ran any code, each given to one script at most (new_state).
  std::vector<std::unique_ptr<sandbox::ScriptState>> spares_;
  // States evicted before an evaluation, closed while idle (or by reclaim when the room is
  // needed); their bytes, closing_bytes_, are still charged to the budget until then.
  std::vector<std::unique_ptr<sandbox::ScriptState>> closing_;
  std::size_t closing_bytes_ = 0;
  std::size_t one_spare_bytes_ = 0;  // what the last spare made held (the room the next one needs)
  std::size_t spares_bytes_ = 0;  // what all of spares_ hold (a spare never runs: it stays fixed)
  bool making_spare_ = false;     // the budget's reclaim frees nothing for a spare
  uint64_t spares_made_ = 0;
  uint64_t spares_taken_ = 0;
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
