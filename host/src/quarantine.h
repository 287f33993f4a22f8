// Crash attribution and quarantine (design/supervision.md "Crash attribution and quarantine"). A
// crash that the running evaluation explains is charged to that evaluation's script record, not
// to the shard; a script charged quarantine_after times within crash_loop_window is refused for
// quarantine_cooldown, before any worker sees it.
//
// Its own owner, not the supervisor's: the state it keeps is on the records (their crash counts
// and quarantine end, atomics), and its readers are not only the loop: admission refuses a
// quarantined script on the caller's thread (Host::Impl::admissible), and whoever places a
// promoted evaluation (the loop, a leader) ends a quarantined one. Only charge() writes, on the
// loop thread, when the supervisor settles a death.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "clock.h"
#include "log.h"
#include "outrun/thread_annotations.h"
#include "restart_policy.h"
#include "script_record.h"
#include "slot_table.h"

namespace outrun::detail {

class Quarantine {
 public:
  struct Config {
    std::chrono::milliseconds window{0};    // HostOptions::crash_loop_window
    int after = 3;                          // HostOptions::quarantine_after
    std::chrono::milliseconds cooldown{0};  // HostOptions::quarantine_cooldown
  };
  Quarantine(const Config& c, const Log& log) : config_(c), log_(log) {}
  Quarantine(const Quarantine&) = delete;
  Quarantine& operator=(const Quarantine&) = delete;

  // The script a death is charged to: the one the dead worker was running (`running`, from its
  // Death record; the slot `table` sent it) when it died of a fault signal or exited with an
  // error code; null for a death nothing explains. `exit`: its exit status, if reaped.
  static const ScriptRecord* suspect(const SlotTable& table, const std::optional<ExitStatus>& exit,
                                     DeathCause cause, uint64_t running);
  // Charges one crash (`exit`) to `r`; true when that quarantines it. The loop thread (the only
  // writer of the records' crash fields).
  bool charge(const ScriptRecord& r, const std::optional<ExitStatus>& exit, int shard) const;
  // Ends (`runtime_error`) the evaluations of `idxs` whose script is quarantined, keeping the
  // others in order; `refusals` counts them. Under the table's shard's mutex.
  static void end_quarantined(SlotTable& table, int shard, std::atomic<uint64_t>& refusals,
                              std::vector<uint32_t>* idxs, Ended* out,
                              std::vector<uint32_t>* promoted);
  // The same for the table's waiting queue.
  static void end_waiting(SlotTable& table, int shard, std::atomic<uint64_t>& refusals, Ended* out,
                          std::vector<uint32_t>* promoted);
  // What a refused evaluation of `r` ends with. Any thread.
  static std::string message(const ScriptRecord& r);

 private:
  const Config config_;
  const Log& log_;
};

}  // namespace outrun::detail

namespace outrun {

// Whether `r` is quarantined now. The common answer costs one relaxed load (hot path: every
// evaluation); only a record that was quarantined reads the clock, and the first call after the
// quarantine passed clears it. Any thread.
inline bool in_quarantine(const detail::ScriptRecord& r) {
  int64_t until = r.quarantined_until_ns.load(std::memory_order_relaxed);
  if (until == 0) [[likely]]
    return false;
  if (detail::monotonic_ns() < until) return true;
  // Over. The exchange fails when another caller cleared it (until is then 0) or the loop thread
  // quarantined it again meanwhile (until is then the new end).
  if (r.quarantined_until_ns.compare_exchange_strong(until, 0, std::memory_order_relaxed))
    return false;
  return until != 0;
}

}  // namespace outrun
