// One shard: the slot table of its evaluations, its current worker process, its dispatcher.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <uv.h>

#include "completion.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/frame_writer.h"
#include "outrun/runner.h"

namespace outrun::detail {

enum class ShardState : uint8_t {
  kRunning,   // a worker is attached (possibly before its hello): evaluations are written to it
  kDown,      // no worker; evaluations wait in `waiting` until the restart
  kStopping,  // the host is shutting down: Shutdown sent, no new evaluations
  kStopped,   // the worker is gone for good
};

// One evaluation between submission and its result. Lives in Shard::slots; the evaluation id on
// the wire is (generation << 32 | index), so a stale or forged id never matches a reused slot.
struct Slot {
  uint32_t generation = 0;
  bool used = false;
  bool sent = false;  // written to the current worker (false: waiting for a restart)
  Script script;
  Inputs inputs;      // kept to re-send after NeedSource or a restart
  Completion done;
};

struct Shard;

// One worker process and its handles. Loop thread only. Freed when both handles are closed.
struct WorkerProcess {
  Shard* shard = nullptr;
  uv_process_t process{};
  uv_poll_t poll{};
  uv_timer_t linger{};  // after end-of-stream: how long we wait for the exit status
  int pid = 0;
  int fd = -1;
  int open_handles = 0;
  bool poll_started = false;
  bool poll_writable = false;
  bool hello = false;
  bool stream_ended = false;  // EOF or a socket error: reading stopped, exit status awaited
  bool dead = false;    // first sign of death seen: group killed, evaluations ended
  bool exited = false;  // libuv reaped it: never signal its pid again
  std::shared_ptr<protocol::FrameWriter> writer;  // also referenced by producers
  protocol::FrameReader reader;
};

struct Shard {
  int index = 0;

  std::mutex mu;  // guards everything down to `writer`
  ShardState state = ShardState::kDown;
  std::vector<Slot> slots;
  std::vector<uint32_t> free_slots;
  std::size_t in_flight = 0;       // used slots
  std::vector<uint8_t> known;      // script ids whose source the current worker has
  std::vector<uint32_t> waiting;   // slots accepted while down, in submission order
  std::shared_ptr<protocol::FrameWriter> writer;  // of the current worker; null while down

  // Loop thread only.
  WorkerProcess* worker = nullptr;
  uv_timer_t restart_timer{};
  std::chrono::steady_clock::time_point started_at{};
  int quick_deaths = 0;  // consecutive deaths of workers that lived < kHealthyUptime
  std::vector<Delivery> to_dispatch;  // scratch: results of one read
  std::atomic<bool> write_blocked{false};  // a producer handed the rest of a write to the loop

  std::unique_ptr<Dispatcher> dispatcher;

  // Counters (relaxed; read by stats).
  std::atomic<uint64_t> starts{0}, deaths{0}, evaluations{0}, reads{0}, frames{0};
  std::atomic<int> pid{0};
};

}  // namespace outrun::detail
