#include "log_ring.h"

#include <algorithm>

namespace outrun::detail {

LogRing::~LogRing() {
  MutexLock lock(mu_);
  if (charged_) charged_->used.fetch_sub(bytes_, std::memory_order_relaxed);
}

void LogRing::pop_oldest(LogBudget* budget) {
  LogRecord& old = ring_[head_];
  const std::size_t b = old.text.size() + kLineOverhead;
  bytes_ -= b;
  budget->used.fetch_sub(b, std::memory_order_relaxed);
  old.text.clear();
  head_ = (head_ + 1) % kMaxLines;
  --size_;
}

void LogRing::append(const std::vector<LogLine>& lines, uint32_t dropped, int64_t unix_us,
                     LogBudget* budget) {
  if (lines.empty() && dropped == 0) return;
  MutexLock lock(mu_);
  charged_ = budget;
  dropped_ += dropped;
  for (const LogLine& line : lines) {
    const std::size_t b = line.text.size() + kLineOverhead;
    // Room from this ring's own oldest lines: when the ring is full, or the budget is.
    if (size_ == kMaxLines) pop_oldest(budget);
    while (size_ > 0 && budget->used.load(std::memory_order_relaxed) + b > budget->limit)
      pop_oldest(budget);
    if (budget->used.fetch_add(b, std::memory_order_relaxed) + b > budget->limit) {
      budget->used.fetch_sub(b, std::memory_order_relaxed);
      ++dropped_;  // the budget is full of other rings' lines
      continue;
    }
    if (ring_.empty()) ring_.resize(kMaxLines);  // on the first line only
    LogRecord& rec = ring_[(head_ + size_) % kMaxLines];
    rec.seq = next_seq_++;
    rec.unix_us = unix_us;
    rec.level = line.level;
    rec.text = line.text;
    bytes_ += b;
    ++size_;
  }
}

LogPage LogRing::read(uint64_t since, std::size_t limit) const {
  MutexLock lock(mu_);
  LogPage page;
  page.next = next_seq_;
  page.dropped = dropped_;
  const uint64_t first = size_ ? ring_[head_].seq : next_seq_;
  if (since == 0) since = first;
  if (since < first) page.missed = first - since;
  for (std::size_t i = 0; i < size_; ++i) {
    const LogRecord& rec = ring_[(head_ + i) % kMaxLines];
    if (rec.seq < since) continue;
    if (limit != 0 && page.lines.size() == limit) {
      page.next = rec.seq;
      break;
    }
    page.lines.push_back(rec);
  }
  return page;
}

void LogRing::clear(LogBudget* budget) {
  MutexLock lock(mu_);
  while (size_ > 0) pop_oldest(budget);
  ring_ = {};
  head_ = 0;
}

const char* script_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
  }
  return "info";
}

}  // namespace outrun::detail
