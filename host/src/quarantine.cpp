// Crash attribution and quarantine (loop thread; design/supervision.md "Crash attribution"). A
// crash that the running evaluation explains is charged to that evaluation's script record, not
// to the shard; a script charged quarantine_after times within crash_loop_window is refused for
// quarantine_cooldown, before any worker sees it.
#include <signal.h>

#include <cassert>

#include "host_impl.h"
#include "outrun/protocol/worker_exit.h"

namespace outrun {

using detail::DeathCause;
using detail::ScriptRecord;
using detail::Shard;
using detail::Slot;
using detail::WorkerProcess;

namespace {

// Signals a process gets from its own faults or its own abort: how an interpreter bug that a
// script reaches ends. Any other signal (SIGKILL, SIGTERM, ...) comes from outside -- an
// operator, the OOM killer, a test -- and says nothing about the script that happened to run.
bool fault_signal(int sig) {
  switch (sig) {
    case SIGSEGV:
    case SIGBUS:
    case SIGILL:
    case SIGFPE:
    case SIGABRT:
    case SIGSYS:
    case SIGTRAP:
      return true;
    default:
      return false;
  }
}

// ScriptRecord::last_crash: the signal, or the exit code << 8.
int32_t pack_exit(const WorkerProcess& w) {
  const auto& x = w.exit_status();
  if (!x) return 0;
  return x->signal != 0 ? x->signal : static_cast<int32_t>((x->code & 0xff) << 8);
}

std::string format_wait(int64_t ns) {
  const int64_t ms = ns <= 0 ? 0 : (ns + 999'999) / 1'000'000;
  if (ms < 10'000) return std::to_string(ms) + " ms";
  return std::to_string((ms + 999) / 1000) + " s";
}

}  // namespace

const ScriptRecord* Host::Impl::crash_suspect(Shard& sh, const WorkerProcess& w, DeathCause cause,
                                              uint64_t running) {
  if (running == 0) return nullptr;  // between evaluations, or still starting
  // kCrash and kExit come from the exit status itself; a kill the host decided has its own cause.
  const auto& x = w.exit_status();
  const bool scripted =
      x && ((cause == DeathCause::kCrash && fault_signal(x->signal)) ||
            (cause == DeathCause::kExit && protocol::script_may_cause_exit(x->code)));
  if (!scripted) return nullptr;
  const Slot* slot = sh.table.sent(running);  // the page is the worker's: untrusted
  return slot ? detail::record_of(slot->script) : nullptr;
}

bool Host::Impl::charge_crash(Shard& sh, const ScriptRecord& r, const WorkerProcess& w) {
  // The loop thread (REQUIRES(loop_role)) is the only writer of the record's crash fields.
  sh.crashes_charged.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = monotonic_ns();
  uint32_t n = r.window_crashes.load(std::memory_order_relaxed);
  if (n == 0 || now - r.first_crash_ns.load(std::memory_order_relaxed) >
                    std::chrono::nanoseconds(opts.crash_loop_window).count()) {
    n = 0;
    r.first_crash_ns.store(now, std::memory_order_relaxed);
  }
  r.window_crashes.store(++n, std::memory_order_relaxed);
  r.crashes.store(r.crashes.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  r.last_crash_ns.store(now, std::memory_order_relaxed);
  r.last_crash.store(pack_exit(w), std::memory_order_relaxed);
  if (n < static_cast<uint32_t>(opts.quarantine_after)) return false;
  // Release: whoever reads the quarantine (acquire, in quarantine_message) sees the counts.
  r.quarantined_until_ns.store(now + std::chrono::nanoseconds(opts.quarantine_cooldown).count(),
                               std::memory_order_release);
  log(LogLevel::warn, "outrun: shard {}: {}", sh.index, quarantine_message(r));
  return true;
}

void Host::Impl::end_quarantined(Shard& sh, std::vector<uint32_t>* idxs, Ended* out,
                                 std::vector<uint32_t>* promoted) {
  std::size_t kept = 0;
  for (uint32_t idx : *idxs) {
    const ScriptRecord& r = *detail::record_of(sh.table[idx].script);
    if (!in_quarantine(r)) {
      (*idxs)[kept++] = idx;
      continue;
    }
    sh.quarantine_refusals.fetch_add(1, std::memory_order_relaxed);
    sh.table.end(idx, Result{Status::runtime_error, {}, quarantine_message(r), sh.index}, out,
                 promoted);
  }
  idxs->resize(kept);
}

void Host::Impl::end_quarantined_waiting(Shard& sh, Ended* out, std::vector<uint32_t>* promoted) {
  const int shard = sh.index;
  std::atomic<uint64_t>& refusals = sh.quarantine_refusals;
  sh.table.end_waiting_if(
      [&](const Slot& slot) -> std::optional<Result> {
        const ScriptRecord& r = *detail::record_of(slot.script);
        if (!in_quarantine(r)) return std::nullopt;
        refusals.fetch_add(1, std::memory_order_relaxed);
        return Result{Status::runtime_error, {}, quarantine_message(r), shard};
      },
      out, promoted);
}

std::string Host::Impl::quarantine_message(const ScriptRecord& r) const {
  const int64_t until = r.quarantined_until_ns.load(std::memory_order_acquire);
  const int32_t last = r.last_crash.load(std::memory_order_relaxed);
  const int sig = last & 0xff;
  std::string how = describe_exit(sig != 0 ? 0 : last >> 8, sig);
  if (how.starts_with("was ")) how.erase(0, 4);
  return "script '" + r.key + "' is quarantined: it crashed its worker " +
         std::to_string(r.window_crashes.load(std::memory_order_relaxed)) + " times (last: " + how +
         "); register new source under its key, or wait " + format_wait(until - monotonic_ns());
}

}  // namespace outrun
