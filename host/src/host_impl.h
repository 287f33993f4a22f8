// outrun::Host::Impl. Threads and what they own (design/threading.md):
//  - caller threads (submit.cpp): encode under the shard's mutex; write frames themselves
//    (FrameWriter), never block on a full socket.
//  - the loop thread (libuv; workers.cpp, supervise.cpp): worker processes, their sockets (reads,
//    writes handed off), status pages, timers, child exits. Completes evaluations: releases the
//    slot, then fulfils futures or hands callbacks to the shard's dispatcher.
//  - one dispatcher thread per shard: runs callbacks.
#pragma once

#include <flatbuffers/flatbuffers.h>
#include <time.h>
#include <uv.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "completion.h"
#include "log.h"
#include "outrun/host.h"
#include "script_registry.h"
#include "shard.h"
#include "wire_codec.h"

namespace outrun {

struct Host::Impl {
  explicit Impl(const HostOptions& o)
      : opts(o),
        log(o.log),
        registry(this, static_cast<uint32_t>(o.shards), o.max_script_bytes, /*deferred_ids=*/true) {
  }

  using Ended = std::vector<std::pair<detail::Completion, Result>>;

  HostOptions opts;
  detail::Log log;
  detail::ScriptRegistry registry;
  std::string worker_path;
  // The workers' environment when it differs from the host's (worker_large_pages): built once
  // at start, null-terminated; empty = inherit.
  std::vector<std::string> worker_env_strings;
  std::vector<char*> worker_env;
  uint64_t timeout_us = 0;
  int64_t hard_deadline_ns = 0;  // T + G

  uv_loop_t loop{};
  uv_async_t wakeup{};
  uv_timer_t shutdown_timer{};
  std::thread loop_thread;
  std::thread::id loop_thread_id;
  std::vector<std::unique_ptr<detail::Shard>> shards;
  flatbuffers::FlatBufferBuilder loop_fbb{4096};  // loop thread only

  std::atomic<bool> stopping{false};
  std::mutex wakeup_mu;  // guards wakeup_open: uv_async_send on a closed handle aborts
  bool wakeup_open = false;
  void wake();                    // any thread: run on_wakeup on the loop (no-op once closed)
  bool shutdown_started = false;  // loop thread only
  int live_workers = 0;           // loop thread only: WorkerProcess objects not yet freed

  // Requests from other threads to the loop (drills).
  enum class CommandKind : uint8_t { kKill, kRestart };
  std::mutex commands_mu;  // guards commands
  std::vector<std::pair<CommandKind, int>> commands;

  // Start-up: the loop thread reports hellos and early failures here.
  std::mutex start_mu;  // guards hellos, start_error
  std::condition_variable start_cv;
  int hellos = 0;
  std::string start_error;

  bool on_loop_thread() const { return std::this_thread::get_id() == loop_thread_id; }

  // submit.cpp (any thread)
  void submit(const Script& script, Inputs&& inputs, detail::Completion&& done);
  void submit_batch(std::vector<Request>&& requests, BatchCallback&& cb);
  void deliver_now(detail::Shard& sh, detail::Completion&& done, Result&& r);
  uint32_t alloc_slot(detail::Shard& sh);
  void free_slot(detail::Shard& sh, uint32_t idx);
  void ensure_key(detail::Shard& sh, uint32_t key_id);
  flatbuffers::Offset<wire::Evaluation> build_evaluation(flatbuffers::FlatBufferBuilder& f,
                                                         detail::Shard& sh, uint32_t idx,
                                                         detail::InputsOffset inputs);
  static std::span<const uint8_t> finish_evaluate(
      flatbuffers::FlatBufferBuilder& f, const flatbuffers::Offset<wire::Evaluation>* items,
      std::size_t n);

  // Ending slots (sh.mu held). end_slot releases the key's flight and queues the coalesced
  // successor in `promoted`; place_promoted sends or parks them (loop thread).
  void end_slot(detail::Shard& sh, uint32_t idx, Result&& r, Ended* out,
                std::vector<uint32_t>* promoted);
  // The one way a slot ends: frees it, releases its key's flight (queueing the coalesced
  // successor in `promoted`) and hands back its completion. sh.mu held.
  detail::Completion release_slot(detail::Shard& sh, uint32_t idx, std::vector<uint32_t>* promoted);
  void place_promoted(detail::Shard& sh, std::vector<uint32_t>& promoted, Ended* out);
  void send_slots(detail::Shard& sh, const std::vector<uint32_t>& idxs);
  void deliver_from_loop(detail::Shard& sh, detail::Completion&& done, Result&& r);
  void deliver_all(detail::Shard& sh, Ended& ended);

  // workers.cpp (loop thread)
  Error spawn(detail::Shard& sh);
  void read_worker(detail::WorkerProcess* w);
  void process_frames(detail::WorkerProcess* w, std::string* violation);
  // The items of a Results frame (null: none).
  void handle_results(detail::WorkerProcess* w,
                      const flatbuffers::Vector<flatbuffers::Offset<wire::Result>>* items,
                      std::string* violation);
  void drain(detail::WorkerProcess* w);
  void stream_ended(detail::WorkerProcess* w);
  void flush_writer(detail::WorkerProcess* w);
  void kill_worker(detail::WorkerProcess* w, detail::DeathCause cause, const std::string& why);
  void worker_died(detail::WorkerProcess* w, detail::DeathCause cause, const std::string& why);
  static void on_exit(uv_process_t* p, int64_t status, int term_signal);
  static void on_poll(uv_poll_t* h, int status, int events);
  static void on_wpoll(uv_poll_t* h, int status, int events);
  static void on_linger_expired(uv_timer_t* t);
  static void on_err_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
  static void on_err_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  static void on_restart_overdue(uv_timer_t* t);
  static void on_handle_closed(uv_handle_t* h);

  // quarantine.cpp: crash attribution (design/supervision.md "Crash attribution").
  // The script a death is charged to: the one `w` was running when it died of a fault signal or
  // exited with an error code; null for a death nothing explains. Loop thread, sh.mu held.
  const detail::ScriptRecord* crash_suspect(detail::Shard& sh, const detail::WorkerProcess& w,
                                            detail::DeathCause cause, uint64_t running);
  // Charges one crash to `r`; true when that quarantines it. Loop thread.
  bool charge_crash(detail::Shard& sh, const detail::ScriptRecord& r,
                    const detail::WorkerProcess& w);
  // Ends (`runtime_error`) the evaluations of `idxs` whose script is quarantined, keeping the
  // others in order. sh.mu held.
  void end_quarantined(detail::Shard& sh, std::vector<uint32_t>* idxs, Ended* out,
                       std::vector<uint32_t>* promoted);
  std::string quarantine_message(const detail::ScriptRecord& r) const;

  // supervise.cpp (loop thread)
  void arm_watchdog(detail::Shard& sh, int64_t now_ns);
  static void on_watchdog(uv_timer_t* t);
  // The one place that decides restarts: when, and whether the shard is in a crash loop.
  // `charged`: the crash was charged to a script (charge_crash), so it is not the shard's.
  void schedule_restart(detail::Shard& sh, detail::DeathCause cause, bool immediate, bool charged,
                        std::chrono::steady_clock::duration uptime);
  static void on_restart(uv_timer_t* t);
  void enter_crash_loop(detail::Shard& sh, const std::string& why);
  static void on_wakeup(uv_async_t* a);
  void run_commands();
  // Freed records: Forget frames to their shards' workers, then their ids may be reused.
  void flush_forgets();
  void begin_shutdown();
  static void on_shutdown_timeout(uv_timer_t* t);
  void maybe_finish_shutdown();
  void set_state(detail::Shard& sh, detail::ShardState s);  // sh.mu held

  // host.cpp
  Error start();
  void shutdown();
};

inline int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Whether `r` is quarantined now. The common answer costs one relaxed load (hot path: every
// evaluation); only a record that was quarantined reads the clock, and the first call after the
// quarantine passed clears it.
inline bool in_quarantine(const detail::ScriptRecord& r) {
  int64_t until = r.quarantined_until_ns.load(std::memory_order_relaxed);
  if (until == 0) [[likely]]
    return false;
  if (monotonic_ns() < until) return true;
  // Over. The exchange fails when another caller cleared it (until is then 0) or the loop thread
  // quarantined it again meanwhile (until is then the new end).
  if (r.quarantined_until_ns.compare_exchange_strong(until, 0, std::memory_order_relaxed))
    return false;
  return until != 0;
}

// How a worker's exit reads in messages: "was killed by signal 11 (Segmentation fault)".
std::string describe_exit(int64_t status, int signal);

// Resident set of a process from /proc/PID/statm, in bytes; 0 if it cannot be read. Statistics
// only (shard_stats), never on a hot path.
uint64_t resident_bytes(int pid);

// Backoff and crash-loop constants (see HostOptions for the configurable ones).
inline constexpr auto kMaxRestartDelay = std::chrono::milliseconds(5000);
inline constexpr auto kHealthyUptime = std::chrono::milliseconds(1000);
inline constexpr uint64_t kLingerMs = 1000;
inline constexpr std::size_t kMaxWorkerLogBytes = 64u << 10;  // per worker process
// Frames of evaluations are cut at this size so a large batch never nears kMaxFrameSize.
inline constexpr std::size_t kFrameCutBytes = 1u << 20;
inline constexpr std::size_t kFrameCutItems = 4096;

}  // namespace outrun
