// One shard: the slot table of its evaluations, its current worker process, its dispatcher.
#pragma once

#include <uv.h>

#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "completion.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/frame_writer.h"
#include "outrun/protocol/status_page.h"
#include "outrun/runner.h"

namespace outrun::detail {

enum class ShardState : uint8_t {
  kRunning,    // a worker is attached (possibly before its hello): evaluations are written to it
  kDown,       // no worker; evaluations wait in `waiting` until the restart
  kCrashLoop,  // no worker and no restart until the cool-down: evaluations end `unavailable`
  kStopping,   // the host is shutting down: Shutdown sent, no new evaluations
  kStopped,    // the worker is gone for good
};
const char* to_string(ShardState s);

// Where an evaluation is between submission and its end.
enum class SlotPlace : uint8_t {
  kFree,
  kPending,  // coalesce-latest: waits behind the evaluation of its key that is in flight
  kWaiting,  // in Shard::waiting: the shard is down, or it is a retry
  kSent,     // written to the current worker
};

// One evaluation between submission and its result. Lives in Shard::slots; the evaluation id on
// the wire is (generation << 32 | index), generation >= 1, so no id is 0 (0 means "nothing" on
// the status page) and a stale or forged id never matches a reused slot.
struct Slot {
  uint32_t generation = 1;
  SlotPlace place = SlotPlace::kFree;
  uint8_t retries = 0;
  bool source_resent =
      false;  // NeedSource answered once for this evaluation (a second is a violation)
  Script script;
  Inputs inputs;  // kept to re-send after NeedSource or a restart
  Completion done;
};

inline uint64_t slot_id(const Slot& s, uint32_t idx) {
  return (uint64_t{s.generation} << 32) | idx;
}

struct Shard;

// Why a worker ended; counted per shard and decides what happens to its evaluations.
enum class DeathCause : uint8_t {
  kExit,       // exited by itself (code 0 after Shutdown, or an error code)
  kCrash,      // died of a signal the host did not send
  kOverrun,    // the host killed it: an evaluation passed T+G
  kSilence,    // the host killed it: heartbeat too old
  kProtocol,   // the host killed it: protocol violation
  kRequested,  // kill_shard / restart_shard, or a Shutdown that did not finish in time
};

// One worker process and its handles. Loop thread only. Freed when all handles are closed.
struct WorkerProcess {
  Shard* shard = nullptr;
  uv_process_t process{};
  uv_poll_t poll{};     // readable: results on `fd`
  uv_poll_t wpoll{};    // writable: `wfd`, only while a frame waits for room (FrameWriter hand-off)
  uv_timer_t linger{};  // after end-of-stream: how long we wait for the exit status
  uv_pipe_t err_pipe{};        // the worker's stderr, logged by the host; closes at its EOF
  std::string err_line;        // a partial line of it
  std::size_t err_logged = 0;  // bytes of it logged so far (bounded)
  int pid = 0;
  // One socket per direction (two socketpairs): a worker blocked reading frames is never woken
  // by the host draining its results (one shared socket has one wait queue for both directions).
  int fd = -1;   // the host reads results here
  int wfd = -1;  // the host writes frames here (owned by `writer`)
  int open_handles = 0;
  bool poll_started = false;
  bool poll_writable = false;
  bool hello = false;
  bool stream_ended = false;       // EOF or a socket error: reading stopped, exit status awaited
  bool dead = false;               // first sign of death seen: group killed, evaluations ended
  bool exited = false;             // libuv reaped it: never signal its pid again
  bool restart_requested = false;  // restart_shard: start the next one at once
  bool exited_cleanly = false;     // exit code 0, no signal (after Shutdown): not a death to report
  int64_t exit_status = 0;         // once exited: its exit code, or 0
  int term_signal = 0;             // once exited: the signal that ended it, or 0
  std::chrono::steady_clock::time_point started_at{};
  int64_t started_ns = 0;  // CLOCK_MONOTONIC, for heartbeat age before the first beat
  std::shared_ptr<protocol::FrameWriter> writer;  // also referenced by producers
  protocol::FrameReader reader;
  std::string page_name;
  std::shared_ptr<boost::interprocess::mapped_region> page_region;
  protocol::StatusPage* page = nullptr;
  // Set by the host before it kills: decides the status of what was running.
  DeathCause kill_cause = DeathCause::kExit;
  uint64_t overrun_id = 0;
};

struct Shard {
  int index = 0;

  std::mutex mu;  // guards everything down to `unavailable_reason`
  ShardState state = ShardState::kDown;
  std::vector<Slot> slots;
  std::vector<uint32_t> free_slots;
  std::vector<uint8_t> known;     // script ids whose source the current worker has
  std::vector<uint32_t> waiting;  // slots accepted while down (and retries), in order
  std::vector<uint32_t> flight;   // by key id: slot index + 1 of the key's evaluation in flight
  std::vector<uint32_t> pending;  // by key id: slot index + 1 of the coalesced one behind it
  std::shared_ptr<protocol::FrameWriter> writer;  // of the current worker; null while down
  std::string unavailable_reason;                 // kCrashLoop: why, for the `unavailable` message

  // Loop thread only.
  WorkerProcess* worker = nullptr;
  uv_timer_t restart_timer{};
  uv_timer_t watchdog{};  // heartbeat age and the running evaluation's T+G deadline
  std::deque<std::chrono::steady_clock::time_point> recent_crashes;  // crash-loop window
  int quick_crashes = 0;              // consecutive crashes of workers that lived < kHealthyUptime
  std::vector<Delivery> to_dispatch;  // scratch: results of one read
  std::atomic<bool> write_blocked{false};  // a producer handed the rest of a write to the loop

  std::unique_ptr<Dispatcher> dispatcher;

  // Counters (relaxed; read by stats).
  std::atomic<uint64_t> starts{0}, deaths{0}, evaluations{0}, reads{0}, frames{0}, retried{0};
  std::atomic<uint64_t> crashes_charged{0}, quarantine_refusals{0};
  std::atomic<uint64_t> by_cause[6] = {};
  std::atomic<int> pid{0};
  std::atomic<int64_t> worker_started_ns{
      0};  // CLOCK_MONOTONIC start of the current worker; 0 while down
  std::atomic<int> public_state{static_cast<int>(ShardState::kDown)};
  std::mutex stats_mu;  // guards last_death, stats_page
  std::string last_death;
  std::shared_ptr<boost::interprocess::mapped_region> stats_page;  // current worker's page
};

}  // namespace outrun::detail
