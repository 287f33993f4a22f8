#include "restart_policy.h"

#include <algorithm>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/worker_exit.h"

namespace outrun::detail {

DeathCause ExitStatus::cause() const {
  return platform::exit_kind(code, signal) == platform::ExitKind::kExited ? DeathCause::kExit
                                                                          : DeathCause::kCrash;
}

Death make_death(DeathCause noticed, const std::optional<DeathCause>& decided,
                 const std::optional<ExitStatus>& exit, Clock::duration uptime,
                 bool restart_requested, std::string how) {
  Death d;
  d.cause = decided ? *decided : noticed;
  if (exit) {
    d.exit_code = exit->code;
    d.signal = exit->signal;
  }
  d.uptime = uptime;
  d.restart_requested = restart_requested;
  d.how = std::move(how);
  return d;
}

bool RestartPolicy::fatal_exit(int64_t code) {
  // It rejected its command line, or could not confine itself (rlimits, no_new_privs, seccomp).
  // Neither changes by starting it again.
  using protocol::WorkerExit;
  return code == protocol::exit_code(WorkerExit::kUsage) ||
         code == protocol::exit_code(WorkerExit::kConfine);
}

RestartDecision RestartPolicy::on_death(const Death& d, Clock::time_point now) {
  if (d.restart_requested) return {RestartDecision::Kind::kRestart, {}, {}};
  // A crash charged to a script (quarantine) restarts after restart_delay, without counting or
  // doubling: its cause is known and fenced off, and the shard's other scripts should not wait.
  if (is_crash(d.cause) && !d.charged) {
    const bool fatal = d.cause == DeathCause::kExit && d.signal == 0 && fatal_exit(d.exit_code);
    return crash(d.how, fatal, d.uptime, now);
  }
  // Kills the host decided restart at once when requested, else after restart_delay.
  if (d.cause == DeathCause::kRequested) return {RestartDecision::Kind::kRestart, {}, {}};
  return {RestartDecision::Kind::kRestart, config_.restart_delay, {}};
}

RestartDecision RestartPolicy::on_start_failure(const std::string& why, Clock::time_point now) {
  return crash("could not be started: " + why, false, Clock::duration{}, now);
}

RestartDecision RestartPolicy::crash(const std::string& how, bool fatal, Clock::duration uptime,
                                     Clock::time_point now) {
  const std::string shard = "shard " + std::to_string(shard_);
  const std::string next =
      "; next start in " + std::to_string(config_.crash_loop_cooldown.count()) + " ms";
  if (fatal)
    return crash_loop(shard + " is in a crash loop: its worker " + how +
                      ", which starting it again will not change" + next);
  recent_.push_back(now);
  while (!recent_.empty() && now - recent_.front() > config_.crash_loop_window) recent_.pop_front();
  if (static_cast<int>(recent_.size()) >= config_.crash_loop_limit)
    return crash_loop(shard + " is in a crash loop: its worker crashed " +
                      std::to_string(recent_.size()) + " times in " +
                      std::to_string(config_.crash_loop_window.count()) + " ms (last: " + how +
                      ")" + next);
  quick_crashes_ = uptime < config_.healthy_uptime ? quick_crashes_ + 1 : 0;
  auto delay = config_.restart_delay * (int64_t{1} << std::min(quick_crashes_, 12));
  return {RestartDecision::Kind::kRestart, std::min(delay, config_.max_restart_delay), {}};
}

RestartDecision RestartPolicy::crash_loop(std::string reason) {
  reset();  // the cool-down is the backoff; the crashes before it are forgiven
  return {RestartDecision::Kind::kCrashLoop, config_.crash_loop_cooldown, std::move(reason)};
}

void RestartPolicy::reset() {
  recent_.clear();
  quick_crashes_ = 0;
}

EvaluationFate RestartPolicy::fate(const Death& d, bool stopping, uint64_t id, uint64_t running,
                                   uint64_t overrun_id, int retries) const {
  if (stopping) return {false, Status::cancelled, "the host shut down before it finished"};
  if (d.cause == DeathCause::kOverrun && id == overrun_id)
    return {false, Status::killed,
            "script ran past its timeout of " + std::to_string(config_.timeout.count()) +
                " ms and grace of " + std::to_string(config_.grace.count()) +
                " ms; its worker was killed"};
  // A crash may have been caused by what it was running: that one is not retried. Kills for
  // another evaluation's overrun, for silence or on request have no suspect.
  if ((is_crash(d.cause) && id == running) || retries >= config_.retries)
    return {false, Status::worker_lost, "its worker " + d.how};
  return {true, Status::ok, {}};
}

}  // namespace outrun::detail
