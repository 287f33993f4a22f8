// The slow lane (design/decisions.md D-slow-lane, design/supervision.md "The slow lane"): which
// scripts run on the last shard, a worker of their own kind, and the counts of moves. A script
// whose evaluation timed out, was killed at T+G or crashed its worker moves in; one that behaved
// there slow_lane_release_after times in a row moves out. Only atomics change (the record's and
// these counters), so any reader of results (the loop thread, a leader) and the loop's death
// handling call it, possibly two shards' readers on one record at once: each move is counted once
// (an exchange), the count of good evaluations is a hint.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "script_record.h"

namespace outrun::detail {

class SlowLane {
 public:
  // `index`: the lane's shard (the last), or -1 when there is none.
  SlowLane(int index, int release_after, std::size_t max_in_flight)
      : index_(index),
        release_after_(static_cast<uint32_t>(release_after)),
        max_in_flight_(max_in_flight) {}
  SlowLane(const SlowLane&) = delete;
  SlowLane& operator=(const SlowLane&) = delete;

  int index() const { return index_; }
  // A result of `r` says it misbehaved (a timeout, a kill at T+G, a crash charged to it): into
  // the lane (once; a no-op without one).
  void misbehaved(const ScriptRecord& r) {
    if (index_ < 0) return;
    r.slow_behaved.store(0, std::memory_order_relaxed);
    if (!r.slow.exchange(true, std::memory_order_relaxed))
      moves_in_.fetch_add(1, std::memory_order_relaxed);
  }
  // A result of `r` read on the lane's shard behaved: out after release_after in a row.
  void behaved(const ScriptRecord& r);
  // Admission on the lane's shard (under its mutex): true, counted as refused, when `in_use`
  // evaluations fill it (slow_lane_max_in_flight).
  bool refuse(std::size_t in_use) {
    if (in_use < max_in_flight_) [[likely]]
      return false;
    refused_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  std::string full_message() const;

  uint64_t moves_in() const { return moves_in_.load(std::memory_order_relaxed); }
  uint64_t moves_out() const { return moves_out_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  const int index_;
  const uint32_t release_after_;
  const std::size_t max_in_flight_;
  std::atomic<uint64_t> moves_in_{0}, moves_out_{0}, refused_{0};
};

}  // namespace outrun::detail
