// outrun::Host: runs scripts in K worker processes ("shards"), never in this process.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "outrun/log.h"
#include "outrun/runner.h"

struct uv_loop_s;  // libuv's loop (Host::post_to_loop); the header does not need <uv.h>

namespace outrun {

// What a second evaluation of a script key does while one is in flight.
enum class SingleFlight : uint8_t {
  refuse,           // answered `busy` at once (the default)
  coalesce_latest,  // waits behind the one in flight, replacing any that already waits (which
                    // ends `busy`): what a tag that changes faster than its script runs wants
  off,              // no single flight: any number of evaluations of a key run, in order
};

struct HostOptions {
  // Number of worker processes (one more with slow_lane, below). Scripts are routed to a shard by
  // a stable hash of their key, so each shard keeps its scripts compiled. 1..64.
  int shards = 2;

  // Where the host's log lines go (a worker's death, its stderr, a callback that threw; never
  // one per evaluation). Empty: stderr, through a logger of the library's own; spdlog's default
  // logger is never used. outrun/spdlog_sink.h adapts an application's spdlog logger.
  LogSink log;

  // Soft limit per evaluation, counted from when the worker starts running it (not from when it
  // was queued): the worker interrupts the script and answers `timeout`. Positive.
  std::chrono::milliseconds timeout{100};

  // Extra time after `timeout` before the host gives up on the worker: an evaluation with no
  // answer by timeout + grace gets its worker's process group killed and ends `killed`. >= 0.
  std::chrono::milliseconds grace{100};

  // Bytes one script's Lua state may hold (its globals, strings, tables, the compiled chunk).
  // Exceeding it ends the evaluation `memory_limit`; the worker goes on serving others. At least
  // 256 KiB (the sandbox's libraries need it).
  std::size_t memory_limit = 16u << 20;

  // Bytes all script states of one worker may hold together (design/sandbox.md, "The worker's
  // script budget"). Before an evaluation the worker closes least recently used idle states
  // until the others hold at most budget - min(memory_limit, budget / 2); should the running
  // script still outgrow what is left, more idle states are closed as it allocates. A closed
  // ("evicted") state leaves the bytecode of its compiled chunk behind (~1 KB for a 40-line
  // script, charged to the budget too): the script's next evaluation builds a new state from it,
  // without the host re-sending the source or the worker compiling it. Its globals start again,
  // so globals are a cache, never a store. When even the bytecode must go (the oldest first),
  // the host re-sends the source. A script that would need more than the budget by itself ends
  // `memory_limit`, naming the budget: with memory_limit above the budget, the budget is a
  // script's real cap. At least 1 MiB.
  // Default 192 MiB, well below the 4 GiB backstop: a bare state costs ~29 KB, so ~6,600 idle
  // states fit before any is evicted, and two shards stay within ~512 MB of RSS (the budget,
  // allocator slack and a worker's own ~8 MB) however many scripts are registered.
  std::size_t worker_script_budget = std::size_t{192} << 20;

  // Process-wide backstop per worker (RLIMIT_AS, bytes of address space): should a worker's
  // memory still blow up past every per-script cap (a leak, an interpreter bug), its allocations
  // fail, and a worker that cannot go on dies and is restarted like any other crash. 0 = none,
  // else at least 64 MiB.
  // Not applied in sanitizer builds (their shadow memory reserves terabytes).
  std::size_t worker_address_space_limit = std::size_t{4} << 30;

  // Workers back their heaps with 2 MiB pages where the kernel allows (mimalloc's large OS pages,
  // transparent huge pages). A new Lua state touches ~14 KB of fresh memory and each page fault
  // is expensive on VMs: a worker compiling 1,000 scripts after a restart faults ~3,500 small
  // pages, or a handful of large ones (outrun-perf warm restart 126 -> 67 ms on the test VM), at
  // the cost of ~3.4 MB more idle RSS per worker (4.8 -> 8.2 MB) (design/budgets.md, D20).
  bool worker_large_pages = false;

  // Benchmarks only (outrun-perf --profile): when not empty, each worker writes a gperftools CPU
  // profile to `<prefix>.<pid>.prof`, recording only between SIGUSR1 and SIGUSR2 sent to its pid;
  // the file is complete once the host has shut down. Needs libprofiler.so.0.
  std::string worker_profile_prefix;

  // Path of the outrun-worker executable. Empty: $OUTRUN_WORKER, else `outrun-worker` next to
  // the running executable, else the installed libexec path.
  std::string worker_path;

  // How long start-up waits for every worker's hello before Host::create fails.
  std::chrono::milliseconds start_timeout{5000};

  // Shutdown: workers get a Shutdown message and this long to finish what is queued; then their
  // process groups are killed and what is still in flight ends `cancelled`.
  std::chrono::milliseconds shutdown_timeout{2000};

  // Futures are fulfilled on the I/O loop thread (no thread hop; fulfilling runs no caller
  // code). false: the loop hands them to the shard's dispatcher thread, like callbacks (a
  // caller that reads its shard's results while it waits fulfils them itself either way); a
  // callback must then not wait on a future of its own shard (its dispatcher would fulfil it).
  bool fulfill_futures_on_loop = true;

  // Opt-in: callbacks (evaluate's and evaluate_batch's) run on the I/O loop thread, where their
  // results are read, instead of on the shard's dispatcher thread: one thread hop fewer per
  // evaluation (design/decisions.md D-inline). Only for callbacks that never block: while one
  // runs, no shard's results are read, no heartbeat or deadline is checked and no worker is
  // restarted. Such a callback may submit evaluations (the result comes later), call kill_shard,
  // restart_shard and the stats calls, and take locks nobody holds for long; it must not wait
  // for another evaluation (a future's get() or evaluate_sync never returns: the loop is the
  // one that would fulfil it), sleep, or destroy the Host. Refusals at submission (invalid handle,
  // cancelled, crash loop, ...) still go through the dispatcher, so a callback never runs inside
  // evaluate().
  bool callbacks_on_loop = false;

  // With callbacks_on_loop: runs on the loop thread after each run of callbacks there (the
  // results of one read from a worker, or the ends one death or shutdown gave), before the loop
  // reads again. Lets callbacks that write somewhere buffer what they write and send it once per
  // run: outrund writes one client's results of a run as one frame and one send. The same rules
  // as the callbacks. Empty: nothing is called.
  std::function<void()> after_loop_callbacks;

  // After the loop thread woke while evaluations are in flight, it polls its sockets without
  // sleeping for up to this long before it sleeps again (design/decisions.md D-busy-poll): a
  // result that arrives meanwhile is read without a wake-up, which on a VM costs about as much
  // CPU as this spin and adds its latency. Meant for a loop that also serves the application's
  // own sockets (post_to_loop), on a machine with cores to spare; off in outrund too. 0 (the
  // default): the loop sleeps whenever nothing is ready. 0..10 ms.
  std::chrono::microseconds busy_poll{0};

  // Bytes all script records may cost together: key, source and chunk name of each plus
  // kScriptRecordOverhead (runner.h). The host keeps every source (a restarted worker gets it
  // again); a key registered again with a new source keeps its old record while a handle or an
  // evaluation uses it, and unregister_script frees a record the same way. A registration that
  // would pass this fails `unavailable`; one of a script already held (same key, same source)
  // never does. Positive.
  std::size_t max_script_bytes = std::size_t{256} << 20;

  // Bytes of Lua bytecode the host keeps for its registered scripts (design/sandbox.md "The
  // compiler"). Each new script's source is compiled by a compile-only process (an outrun-worker
  // that never runs a chunk, confined like the workers, restarted if it dies or breaks the
  // protocol) into bytecode the host keeps; a worker that does not hold the script yet (after a
  // restart or a kill) gets that bytecode instead of the source and loads it (~2 µs) instead of
  // compiling it (~22 µs for a 40-line script). A 40-line script's bytecode is ~1 KB: the
  // default holds ~250,000. A script past it, one whose source does not compile and one not
  // compiled yet are sent with their source, as without it. 0: no compile-only process.
  std::size_t bytecode_cache_bytes = std::size_t{256} << 20;

  // Evaluations accepted for a shard whose worker is restarting, before they are answered
  // `unavailable`.
  std::size_t max_queued_while_down = 10000;

  // Delay before a shard whose worker died is started again; doubles with each quick death
  // (a worker that lived < 1 s), up to 5 s.
  std::chrono::milliseconds restart_delay{10};

  // Liveness: each worker's heartbeat thread writes its status page this often; a worker
  // whose heartbeat is older than `silence_limit` (frozen, or stopped with SIGSTOP) is killed and
  // restarted. Independent of the pipes: a worker blocked writing results to a busy host is alive.
  // heartbeat_interval positive and below silence_limit.
  std::chrono::milliseconds heartbeat_interval{100};
  std::chrono::milliseconds silence_limit{2000};

  // At most one evaluation of a script key in flight (see SingleFlight).
  SingleFlight single_flight = SingleFlight::refuse;

  // Innocent bystanders: evaluations lost with a worker that was killed for another evaluation's
  // overrun, for silence or on request are sent again, this many times, to the restarted worker.
  // The evaluation a worker was running when it crashed is never retried (it may be the cause).
  // 0..10.
  int retries = 1;

  // Crash loop: when a shard's worker has crashed (died of a signal the host did not send,
  // exited with an error, violated the protocol, or could not be started) `crash_loop_limit`
  // times within `crash_loop_window`, not counting crashes charged to a script (quarantine,
  // below), the shard stops restarting: its evaluations end `unavailable` at once, with the
  // reason, until `crash_loop_cooldown` has passed. Kills the host decided (T+G overruns,
  // silence, drills) do not count: a runaway script must not take its shard's other scripts down
  // with it. A worker that exits with a code that will not change by restarting it (64: bad
  // command line, 79: cannot confine itself) puts the shard in its crash loop at once.
  // crash_loop_limit: at least 1.
  int crash_loop_limit = 5;
  std::chrono::milliseconds crash_loop_window{10000};
  std::chrono::milliseconds crash_loop_cooldown{30000};

  // Quarantine (design/supervision.md "Crash attribution"): a worker that dies of a fault signal
  // (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP) or exits with an error code
  // while it runs an evaluation charges that crash to the evaluation's script, not to the
  // shard's crash loop. A script charged `quarantine_after` times within `crash_loop_window` is
  // quarantined for `quarantine_cooldown`: its evaluations end `runtime_error` at once, with the
  // reason, and never reach a worker, so one hostile script cannot take its shard from the
  // others. Registering new source under its key (a new record) ends it at once.
  // quarantine_after: 1..1000; quarantine_cooldown: positive.
  int quarantine_after = 2;
  std::chrono::milliseconds quarantine_cooldown{60000};

  // The slow lane (design/decisions.md D-slow-lane): one more worker process, the last shard
  // (index `shards`), where a script runs from the moment one of its evaluations timed out, was
  // killed at T+G or crashed its worker, until it behaves again, so that the honest scripts of
  // its home shard never wait behind its overruns (a worker runs one evaluation at a time).
  // Its evaluations keep their timeout, grace, kills and retries; its worker is supervised and
  // restarted like any other. Costs one worker process (~5 MB idle) and nothing per evaluation
  // of a script that never misbehaved (one flag on the script record, read when it is routed).
  // false: no lane; every script always runs on its home shard.
  bool slow_lane = true;
  // A script leaves the lane after this many evaluations in a row there that ended without
  // `timeout` or `killed` (and without a charged crash). 1..10000.
  int slow_lane_release_after = 8;
  // Evaluations the lane holds at once (sent to its worker or waiting for it); more end `busy`
  // at once instead of queueing behind the runaways: a flood from misbehaving scripts is bounded.
  // 1..100000.
  std::size_t slow_lane_max_in_flight = 64;
};

// Every limit Host::create enforces, and only those (each is written next to its option above):
// the error names the option. outrund's config and outrun-perf's arms check with it too.
Error validate(const HostOptions& options);

// State and counters of one shard, for tests, the CLI and the perf harness.
struct ShardStats {
  int index = 0;
  bool slow_lane = false;  // this shard is the slow lane (HostOptions::slow_lane)
  std::string state;       // "running", "down", "crash_loop", "stopping", "stopped"
  int pid = 0;             // current worker, 0 while down
  int64_t uptime_ms = -1;  // how long the current worker has run; -1 while down
  uint64_t starts = 0;     // worker processes started
  uint64_t deaths = 0;     // worker processes that ended, for any reason
  // Deaths by cause.
  uint64_t killed_overrun = 0;    // an evaluation passed T+G
  uint64_t killed_silence = 0;    // heartbeat older than silence_limit
  uint64_t killed_requested = 0;  // kill_shard / restart_shard
  uint64_t crashed = 0;           // died of a signal it was not sent by the host
  uint64_t exited = 0;            // exited by itself with a non-zero code
  uint64_t protocol_violations = 0;
  uint64_t crashes_charged = 0;      // crashes charged to a script (not to the crash loop)
  std::string last_death;            // the cause of the last death, for people
  uint64_t evaluations = 0;          // submitted to this shard
  uint64_t retried = 0;              // evaluations sent again after their worker died
  uint64_t quarantine_refusals = 0;  // evaluations ended `runtime_error`: script quarantined
  uint64_t read_syscalls = 0;
  uint64_t frames_read = 0;
  uint64_t in_flight = 0;  // evaluations accepted and not ended yet (sent, or waiting to be)
  // Futures submitted while the loop did not poll the shard, left for their caller to read when
  // it waits (design/threading.md "A future's wait").
  uint64_t futures_left_to_caller = 0;
  // From the worker's status page (0 while down).
  uint64_t worker_evaluations = 0;
  uint64_t worker_compiles = 0;
  uint64_t worker_scripts = 0;
  uint64_t worker_peak_script_bytes = 0;
  uint64_t worker_script_bytes = 0;  // its states and kept bytecode now (after its last evaluation)
  uint64_t worker_evictions = 0;     // idle script states closed for worker_script_budget
  uint64_t worker_reloads = 0;       // evicted scripts run again from the bytecode the worker kept
  // Scripts the current worker loaded from the compile-only process's bytecode (not compiled).
  uint64_t worker_bytecode_loads = 0;
  uint64_t worker_rss_bytes = 0;       // resident set now (/proc/PID/statm, read by this call)
  uint64_t worker_peak_rss_bytes = 0;  // peak resident set of the current worker (status page)
  int64_t heartbeat_age_ms = -1;
};

// HostOptions::bytecode_cache_bytes: the compile-only process and what it made.
struct CompilerStats {
  int pid = 0;                // the compile-only process now (0: none, or restarting)
  uint64_t compiled = 0;      // scripts whose bytecode is kept
  uint64_t refused = 0;       // not kept: their source does not compile, or it did not fit
  uint64_t restarts = 0;      // compile-only processes started after the first
  uint64_t kills = 0;         // killed: late, or it broke the protocol
  uint64_t cached_bytes = 0;  // bytecode kept now
  bool idle = true;           // every registered script was compiled or refused (or no process)
};

// Crashes charged to one script record (HostOptions::quarantine_after), and its lane.
struct ScriptCrashStats {
  uint32_t crashes = 0;            // crashes of a worker while it ran this script
  bool quarantined = false;        // its evaluations end `runtime_error` now
  int64_t quarantine_left_ms = 0;  // how long that lasts (0: not quarantined)
  bool slow_lane = false;          // its evaluations run in the slow lane now
};

// HostOptions::slow_lane: the lane and the scripts that went through it (all zeros and shard -1
// without a lane). Per-shard figures of the lane's worker: shard_stats(shard).
struct SlowLaneStats {
  int shard = -1;             // its index (the last shard)
  uint64_t scripts = 0;       // scripts in the lane now
  uint64_t moves_in = 0;      // scripts moved in (a timeout, a kill at T+G, a charged crash)
  uint64_t moves_out = 0;     // scripts moved back to their home shard after behaving
  uint64_t evaluations = 0;   // evaluations submitted to the lane
  uint64_t refused_full = 0;  // ended `busy`: the lane held slow_lane_max_in_flight already
};

// Thread-safe: every member may be called from any thread, concurrently, including from inside
// a callback (which runs on a shard's dispatcher thread, or on the loop thread with
// callbacks_on_loop; never on the caller's). Not copyable or
// movable: the workers, the loop thread and the dispatchers belong to this object.
// Preconditions: a `Script` passed in comes from this Host's register_script (another runner's
// handle, or an empty one, ends `invalid_argument`); the Host outlives no callback (the
// destructor waits until every callback has run).
class Host final : public Runner {
 public:
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  // Validates `options` (validate() below), starts the workers and waits for their hello. On
  // failure returns the error and leaves *out empty.
  static Error create(const HostOptions& options, std::unique_ptr<Host>* out);

  // Stops: pending evaluations finish or end `cancelled`, workers exit (message, then
  // SIGKILL of their process group), all callbacks have run when this returns.
  ~Host() override;

  Error register_script(std::string_view key, std::string_view source, Script* out) override;
  // The same, asking `admit` before a new record is made (not when the key already holds this
  // source), under the registry's lock: it must not call into this Host. outrund charges each
  // record to a uid's quota with it.
  Error register_script(std::string_view key, std::string_view source, Script* out,
                        const AdmitFn& admit);
  // With options.check: the compile-only process (bytecode_cache_bytes) compiles the source
  // first, and this call waits for its verdict on the calling thread (never call it on the loop
  // thread: invalid_argument). A source that does not compile fails `compile_error` ("KEY:LINE:
  // ..." as Lua says it) and registers nothing; `unavailable` when the check cannot be made
  // (bytecode_cache_bytes 0, the compile-only process in its crash loop, shutting down).
  Error register_script(std::string_view key, std::string_view source, Script* out,
                        const RegisterOptions& options);
  // The check alone, without waiting: `done` gets its verdict on the loop thread (never inside
  // this call; dropped uncalled once the host is shutting down). outrund's `register --check`.
  void check_source(std::string_view key, std::string_view source, std::function<void(Error)> done);
  Error unregister_script(std::string_view key) override;
  void evaluate(const Script& script, Inputs inputs, Callback done) override;
  Future evaluate(const Script& script, Inputs inputs) override;
  // Waits on this thread. While it waits the caller may read its shard's results itself
  // (leader/follower, design/threading.md): it then also releases the slots of, and fulfils the
  // futures of, other evaluations of that shard it reads, and posts their callbacks to the
  // shard's dispatcher (a callback never runs on the caller, callbacks_on_loop or not). It must
  // not be called from a callback that runs on the loop (callbacks_on_loop). The loop thread keeps
  // the timers, kills, deaths and restarts. The slot is released before this returns; the result is
  // the one evaluate() would have given.
  Result evaluate_sync(const Script& script, Inputs inputs) override;
  void evaluate_batch(std::vector<Request> requests, BatchCallback done) override;

  // Shards, the slow lane included (it is the last one: slow_lane_shard()).
  int shards() const;
  // The slow lane's shard index; -1 without one.
  int slow_lane_shard() const;
  // The shard an evaluation of `script` submitted now goes to: its home shard, or the slow lane
  // while it is there (0 for a handle of another runner). outrund schedules by it.
  int shard_of(const Script& script) const;
  SlowLaneStats slow_lane_stats() const;
  // True on the I/O loop thread: where callbacks run with callbacks_on_loop (a refusal at
  // submission still arrives on a dispatcher). Callable from a callback, also from the last ones,
  // which run while the Host is destroyed.
  bool on_loop_thread() const;
  // Runs `fn` on the I/O loop thread with the Host's libuv loop, soon (never inside this call,
  // also when called from the loop thread). For an application that serves its own sockets,
  // timers or signals on the Host's loop instead of a loop thread of its own (outrund,
  // design/daemon.md "One loop"): its handles' callbacks then run on the loop thread, under the
  // rules of callbacks_on_loop (they never block), and may submit. It closes every handle it
  // made on the loop before it destroys the Host: ~Host waits until the loop has none left.
  // False once the Host is shutting down (`fn` is dropped, not run).
  bool post_to_loop(std::function<void(uv_loop_s*)> fn);
  ShardStats shard_stats(int shard) const;
  // Records alive and what they cost against max_script_bytes (tests, outrund's stats). A
  // record's worker states are forgotten shortly after it is freed (asynchronously, on the
  // loop thread; ShardStats::worker_scripts follows).
  RegistryStats registry_stats() const;
  // The compile-only process and the bytecode kept (all zeros with bytecode_cache_bytes 0).
  CompilerStats compiler_stats() const;
  // Crashes and quarantine of `script`'s record (zeros for a handle of another runner).
  ScriptCrashStats script_crashes(const Script& script) const;

  // Drills. kill_shard: SIGKILL the shard's process group now; what it was running is retried on
  // the restarted worker. restart_shard: the worker finishes what it has, exits, and a new one
  // starts at once (evaluations submitted meanwhile wait for it). Both return at once.
  Error kill_shard(int shard);
  Error restart_shard(int shard);
  // Worker pids, one per shard (0 for a shard that is down).
  std::vector<int> worker_pids() const;

  struct Impl;

 private:
  explicit Host(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace outrun
