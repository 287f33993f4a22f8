// Crash attribution and quarantine (quarantine.h).
#include "quarantine.h"

#include <cassert>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/worker_exit.h"

namespace outrun::detail {

namespace {

// ScriptRecord::last_crash: the signal in the low byte, the exit code (32 bits: a POSIX status or
// a Windows NTSTATUS) above it.
int64_t pack_exit(const std::optional<ExitStatus>& x) {
  if (!x) return 0;
  return static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(x->code)) << 8) |
         (x->signal & 0xff);
}

std::string format_wait(int64_t ns) {
  const int64_t ms = ns <= 0 ? 0 : (ns + 999'999) / 1'000'000;
  if (ms < 10'000) return std::to_string(ms) + " ms";
  return std::to_string((ms + 999) / 1000) + " s";
}

}  // namespace

const ScriptRecord* Quarantine::suspect(const SlotTable& table, const std::optional<ExitStatus>& x,
                                        DeathCause cause, uint64_t running) {
  if (running == 0) return nullptr;  // between evaluations, or still starting
  // kCrash and kExit come from the exit status itself; a kill the host decided has its own cause.
  const bool scripted =
      x && ((cause == DeathCause::kCrash &&
             platform::exit_kind(x->code, x->signal) == platform::ExitKind::kFault) ||
            (cause == DeathCause::kExit && protocol::script_may_cause_exit(x->code)));
  if (!scripted) return nullptr;
  const Slot* slot = table.sent(running);  // the page is the worker's: untrusted
  return slot ? record_of(slot->script) : nullptr;
}

bool Quarantine::charge(const ScriptRecord& r, const std::optional<ExitStatus>& exit,
                        int shard) const {
  // The loop thread is the only writer of the record's crash fields.
  const int64_t now = monotonic_ns();
  uint32_t n = r.window_crashes.load(std::memory_order_relaxed);
  if (n == 0 || now - r.first_crash_ns.load(std::memory_order_relaxed) >
                    std::chrono::nanoseconds(config_.window).count()) {
    n = 0;
    r.first_crash_ns.store(now, std::memory_order_relaxed);
  }
  r.window_crashes.store(++n, std::memory_order_relaxed);
  r.crashes.store(r.crashes.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  r.last_crash_ns.store(now, std::memory_order_relaxed);
  r.last_crash.store(pack_exit(exit), std::memory_order_relaxed);
  if (n < static_cast<uint32_t>(config_.after)) return false;
  // Release: whoever reads the quarantine (acquire, in message) sees the counts.
  r.quarantined_until_ns.store(now + std::chrono::nanoseconds(config_.cooldown).count(),
                               std::memory_order_release);
  log_(LogLevel::warn, "outrun: shard {}: {}", shard, message(r));
  return true;
}

void Quarantine::end_quarantined(SlotTable& table, int shard, std::atomic<uint64_t>& refusals,
                                 std::vector<uint32_t>* idxs, Ended* out,
                                 std::vector<uint32_t>* promoted) {
  std::size_t kept = 0;
  for (uint32_t idx : *idxs) {
    const ScriptRecord& r = *record_of(table[idx].script);
    if (!in_quarantine(r)) {
      (*idxs)[kept++] = idx;
      continue;
    }
    refusals.fetch_add(1, std::memory_order_relaxed);
    table.end(idx, Result{Status::runtime_error, {}, message(r), shard}, out, promoted);
  }
  idxs->resize(kept);
}

void Quarantine::end_waiting(SlotTable& table, int shard, std::atomic<uint64_t>& refusals,
                             Ended* out, std::vector<uint32_t>* promoted) {
  table.end_waiting_if(
      [&](const Slot& slot) -> std::optional<Result> {
        const ScriptRecord& r = *record_of(slot.script);
        if (!in_quarantine(r)) return std::nullopt;
        refusals.fetch_add(1, std::memory_order_relaxed);
        return Result{Status::runtime_error, {}, message(r), shard};
      },
      out, promoted);
}

std::string Quarantine::message(const ScriptRecord& r) {
  const int64_t until = r.quarantined_until_ns.load(std::memory_order_acquire);
  const int64_t last = r.last_crash.load(std::memory_order_relaxed);
  const int sig = static_cast<int>(last & 0xff);
  std::string how = platform::describe_exit(sig != 0 ? 0 : static_cast<uint32_t>(last >> 8), sig);
  if (how.starts_with("was ")) how.erase(0, 4);
  return "script '" + r.key + "' is quarantined: it crashed its worker " +
         std::to_string(r.window_crashes.load(std::memory_order_relaxed)) + " times (last: " + how +
         "); register new source under its key, or wait " + format_wait(until - monotonic_ns());
}

}  // namespace outrun::detail
