// What happens after a worker dies, as a plain value (design/supervision.md "Restart policy"):
// whether the death was the worker's own failure, when the next worker starts or whether the
// shard is in a crash loop, and for each evaluation the dead worker had, retry or end with which
// status. No processes, no libuv, no clock of its own: the caller passes `now`, so the unit tests
// drive it with a fake clock (tests/host/restart_policy_test.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "outrun/status.h"

namespace outrun::detail {

// Why a worker ended; counted per shard and decides what happens to its evaluations.
enum class DeathCause : uint8_t {
  kExit,       // exited by itself (code 0 after Shutdown, or an error code)
  kCrash,      // died of a signal the host did not send
  kOverrun,    // the host killed it: an evaluation passed T+G
  kSilence,    // the host killed it: heartbeat too old
  kProtocol,   // the host killed it: protocol violation
  kRequested,  // kill_shard / restart_shard, or a Shutdown that did not finish in time
};
inline constexpr int kDeathCauses = 6;

using Clock = std::chrono::steady_clock;

// How a process ended, once reaped.
struct ExitStatus {
  int64_t code = 0;
  int signal = 0;
  bool clean() const { return code == 0 && signal == 0; }
  // The cause of a death the host did not decide: a signal is a crash, else it exited.
  // A signal (POSIX) or a fault's or a kill's NTSTATUS (Windows): platform::exit_kind.
  DeathCause cause() const;
};

struct Death {
  DeathCause cause = DeathCause::kExit;
  int64_t exit_code = 0;  // when it exited by itself
  int signal = 0;         // the signal that ended it, or 0
  Clock::duration uptime{};
  bool restart_requested = false;  // restart_shard: the next worker starts at once
  bool charged = false;     // the crash was charged to a script (quarantine): not the shard's
  std::string how;          // "was killed by signal 11 (Segmentation fault)": for messages
  uint64_t running = 0;     // the evaluation its status page named as running (0: none)
  uint64_t overrun_id = 0;  // kOverrun: the evaluation that passed T+G
};

// A process's Death record, built once (WorkerProcess::death) for a shard's worker and the
// compile-only process alike. The host's decision to kill (`decided`), when there was one, names
// the cause; else what noticed the death (`noticed`: the exit status, an end of stream, ...).
Death make_death(DeathCause noticed, const std::optional<DeathCause>& decided,
                 const std::optional<ExitStatus>& exit, Clock::duration uptime,
                 bool restart_requested, std::string how);

struct RestartConfig {
  std::chrono::milliseconds restart_delay{10};
  std::chrono::milliseconds max_restart_delay{5000};
  Clock::duration healthy_uptime = std::chrono::milliseconds(1000);
  int crash_loop_limit = 5;
  std::chrono::milliseconds crash_loop_window{10000};
  std::chrono::milliseconds crash_loop_cooldown{30000};
  int retries = 1;
  std::chrono::milliseconds timeout{0}, grace{0};  // for the `killed` message
};

struct RestartDecision {
  enum class Kind : uint8_t { kRestart, kCrashLoop };
  Kind kind = Kind::kRestart;
  std::chrono::milliseconds delay{0};  // kRestart: start the next worker after it;
                                       // kCrashLoop: the cool-down before the next start
  std::string reason;                  // kCrashLoop: the `unavailable` message
};

// What becomes of one evaluation the dead worker had been sent.
struct EvaluationFate {
  bool retry = false;  // else it ends with status/error
  Status status = Status::ok;
  std::string error;
};

class RestartPolicy {
 public:
  RestartPolicy(int shard, const RestartConfig& config) : shard_(shard), config_(config) {}

  // The one home of "was this a crash": the worker's own failure (a signal the host did not
  // send, an exit with an error, a protocol violation), as opposed to a kill the host decided
  // (overrun, silence, a request). Only crashes can have a suspect, count toward the crash loop
  // and back off.
  static bool is_crash(DeathCause cause) {
    return cause == DeathCause::kCrash || cause == DeathCause::kExit ||
           cause == DeathCause::kProtocol;
  }
  // Exit codes that mean the next worker will fail the same way (bad command line, cannot
  // confine itself): the shard goes to its crash loop at once, like nginx's fatal exit, instead of
  // cycling through backoff.
  static bool fatal_exit(int64_t code);

  // A worker died: when does the next one start, or is the shard in a crash loop?
  RestartDecision on_death(const Death& d, Clock::time_point now);
  // A worker could not be started: a crash (it counts and backs off like one).
  RestartDecision on_start_failure(const std::string& why, Clock::time_point now);
  // restart_shard on a shard that is down or in its crash loop: forget its crashes.
  void reset();

  // For one evaluation the dead worker had been sent. `id`: the evaluation; `running`: the one
  // its status page named as running when it died (0: none); `overrun_id`: the one that passed
  // T+G (kOverrun); `retries`: how often it was retried already.
  EvaluationFate fate(const Death& d, bool stopping, uint64_t id, uint64_t running,
                      uint64_t overrun_id, int retries) const;

  int recent_crashes() const { return static_cast<int>(recent_.size()); }

 private:
  RestartDecision crash(const std::string& how, bool fatal, Clock::duration uptime,
                        Clock::time_point now);
  RestartDecision crash_loop(std::string reason);

  int shard_;
  RestartConfig config_;
  std::deque<Clock::time_point> recent_;  // crashes within crash_loop_window
  int quick_crashes_ = 0;  // consecutive crashes of workers that lived < healthy_uptime
};

}  // namespace outrun::detail
