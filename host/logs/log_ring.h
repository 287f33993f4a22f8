// The recent log lines of one script or one tag (design/daemon.md "Script logs"): a bounded ring
// that evaluations append to (any thread) and readers page through by sequence number. Made
// empty (no storage until a line comes), so a script or tag that never logs costs a mutex and
// a few words. All rings of one kind share a byte budget: past it a ring makes room from its own
// oldest lines, never another's, so a script that logs a lot costs itself.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "outrun/runner.h"
#include "outrun/thread_annotations.h"

namespace outrun::detail {

struct LogBudget {
  std::atomic<std::size_t> used{0};  // text bytes (+ kLineOverhead each) held by all rings
  std::size_t limit = 32u << 20;
};

class LogRing {
 public:
  static constexpr std::size_t kMaxLines = 64;
  static constexpr std::size_t kLineOverhead = 48;  // counted per line against the budget

  LogRing() = default;
  ~LogRing();
  LogRing(const LogRing&) = delete;
  LogRing& operator=(const LogRing&) = delete;

  // Appends an evaluation's lines, stamped `unix_us`; `dropped` (the result's logs_dropped) and
  // lines the budget has no room for are counted. Returns without locking when there is
  // nothing.
  void append(const std::vector<LogLine>& lines, uint32_t dropped, int64_t unix_us,
              LogBudget* budget) EXCLUDES(mu_);
  // Lines numbered `since` and after (0: from the oldest kept), at most `limit` (0: all).
  LogPage read(uint64_t since, std::size_t limit) const EXCLUDES(mu_);
  // Gives back every line's bytes to the budget (the ring's owner is going).
  void clear(LogBudget* budget) EXCLUDES(mu_);

 private:
  void pop_oldest(LogBudget* budget) REQUIRES(mu_);
  mutable Mutex mu_;
  std::vector<LogRecord> ring_ GUARDED_BY(mu_);  // circular once it holds kMaxLines
  std::size_t head_ GUARDED_BY(mu_) = 0;         // index of the oldest line
  std::size_t size_ GUARDED_BY(mu_) = 0;
  std::size_t bytes_ GUARDED_BY(mu_) = 0;  // charged to the budget
  uint64_t next_seq_ GUARDED_BY(mu_) = 1;
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
  LogBudget* charged_ GUARDED_BY(mu_) = nullptr;  // the budget bytes_ is charged to
};

// "debug", "info", "warn", "error": a script's level names (log.warn is "warn").
const char* script_level_name(LogLevel level);

}  // namespace outrun::detail
