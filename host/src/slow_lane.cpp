// The slow lane's moves out, and its refusal (slow_lane.h).
#include "slow_lane.h"

namespace outrun::detail {

void SlowLane::behaved(const ScriptRecord& r) {
  if (!r.slow.load(std::memory_order_relaxed)) return;  // already out (a lane change in flight)
  const uint32_t n = r.slow_behaved.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n < release_after_) return;
  r.slow_behaved.store(0, std::memory_order_relaxed);
  if (r.slow.exchange(false, std::memory_order_relaxed))
    moves_out_.fetch_add(1, std::memory_order_relaxed);
}

std::string SlowLane::full_message() const {
  return "the slow lane already holds " + std::to_string(max_in_flight_) +
         " evaluations of scripts that timed out or were killed (slow_lane_max_in_flight)";
}

}  // namespace outrun::detail
