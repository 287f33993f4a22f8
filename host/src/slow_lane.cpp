// The slow lane (design/decisions.md D-slow-lane, design/supervision.md "The slow lane"): a
// script whose evaluation timed out, was killed at T+G or crashed its worker runs on a worker of
// its own kind, the last shard, until slow_lane_release_after evaluations in a row behaved there.
// Called by whoever reads a result (the loop thread or a leader) and by the loop when a worker
// dies; only atomics of the record and of the host change, so two readers of two shards may
// meet on one record: each move is counted once (exchange), the count of good evaluations is a
// hint.
#include "host_impl.h"

namespace outrun {

void Host::Impl::misbehaved(const detail::ScriptRecord& r) {
  if (lane < 0) return;
  r.slow_behaved.store(0, std::memory_order_relaxed);
  if (!r.slow.exchange(true, std::memory_order_relaxed))
    lane_moves_in.fetch_add(1, std::memory_order_relaxed);
}

void Host::Impl::behaved_in_lane(const detail::ScriptRecord& r) {
  if (!r.slow.load(std::memory_order_relaxed)) return;  // already out (a lane change in flight)
  const uint32_t n = r.slow_behaved.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n < static_cast<uint32_t>(opts.slow_lane_release_after)) return;
  r.slow_behaved.store(0, std::memory_order_relaxed);
  if (r.slow.exchange(false, std::memory_order_relaxed))
    lane_moves_out.fetch_add(1, std::memory_order_relaxed);
}

std::string Host::Impl::lane_full_message() const {
  return "the slow lane already holds " + std::to_string(opts.slow_lane_max_in_flight) +
         " evaluations of scripts that timed out or were killed (slow_lane_max_in_flight)";
}

}  // namespace outrun
