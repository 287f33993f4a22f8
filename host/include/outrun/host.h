// outrun::Host: runs scripts in K worker processes ("shards"), never in this process.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "outrun/runner.h"

namespace outrun {

struct HostOptions {
  // Number of worker processes. Scripts are routed to a shard by a stable hash of their key, so
  // each shard keeps its scripts compiled. 1..64.
  int shards = 2;

  // Soft limit per evaluation, counted from when the worker starts running it (not from when it
  // was queued): the worker interrupts the script and answers `timeout`.
  std::chrono::milliseconds timeout{100};

  // Extra time after `timeout` before the host gives up on the worker: an evaluation with no
  // answer by timeout + grace gets its worker's process group killed and ends `killed`.
  std::chrono::milliseconds grace{100};

  // Bytes one script's Lua state may hold (its globals, strings, tables, the compiled chunk).
  // Exceeding it ends the evaluation `memory_limit`; the worker goes on serving others.
  std::size_t memory_limit = 16u << 20;

  // Path of the outrun-worker executable. Empty: $OUTRUN_WORKER, else `outrun-worker` next to
  // the running executable, else the installed libexec path.
  std::string worker_path;

  // How long start-up waits for every worker's hello before Host::create fails.
  std::chrono::milliseconds start_timeout{5000};

  // Shutdown: workers get a Shutdown message and this long to finish what is queued; then their
  // process groups are killed and what is still in flight ends `cancelled`.
  std::chrono::milliseconds shutdown_timeout{2000};

  // Futures are fulfilled on the I/O loop thread (no thread hop; fulfilling runs no caller
  // code). false: through the shard's dispatcher thread, like callbacks.
  bool fulfill_futures_on_loop = true;

  // Evaluations accepted for a shard whose worker is restarting, before they are answered
  // `unavailable`.
  std::size_t max_queued_while_down = 10000;

  // Delay before a shard whose worker died is started again.
  std::chrono::milliseconds restart_delay{10};
};

// Counters of one shard, for tests, the CLI and the perf harness.
struct ShardStats {
  int index = 0;
  int pid = 0;             // current worker, 0 while down
  uint64_t starts = 0;     // worker processes started
  uint64_t deaths = 0;     // worker processes that died or were stopped
  uint64_t evaluations = 0;
  uint64_t read_syscalls = 0;
  uint64_t frames_read = 0;
};

class Host final : public Runner {
 public:
  // Validates `options`, starts the workers and waits for their hello. On failure returns the
  // error and leaves *out empty.
  static Error create(const HostOptions& options, std::unique_ptr<Host>* out);

  // Stops: pending evaluations finish or end `cancelled`, workers exit (message, then
  // SIGKILL of their process group), all callbacks have run when this returns.
  ~Host() override;

  Error register_script(std::string_view key, std::string_view source, Script* out) override;
  void evaluate(const Script& script, Inputs inputs, Callback done) override;
  std::future<Result> evaluate(const Script& script, Inputs inputs) override;
  void evaluate_batch(std::vector<Request> requests, BatchCallback done) override;

  int shards() const;
  ShardStats shard_stats(int shard) const;
  // Worker pids, one per shard (0 for a shard that is down).
  std::vector<int> worker_pids() const;

  struct Impl;

 private:
  explicit Host(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace outrun
