// outrun-perf --runaway-drill (design/budgets.md "Runaway drill"): one runaway script submitted
// again as soon as each of its evaluations ends, and an honest neighbour on the same shard at a
// fixed rate; the neighbour's latency and throughput with the slow lane and without it
// (HostOptions::slow_lane), in the same run (D-slow-lane).
#pragma once

#include "outrun/host.h"

namespace outrun::perf {

struct RunawayDrillParams {
  double rate = 1000;    // neighbour evaluations per second (open loop)
  double seconds = 5;    // per arm
  int runaway_kind = 0;  // 0: `while true do end` (ends `timeout` at T); 1: stuck in one C call
                         // (killed at T+G)
};

// Prints both arms and returns 0, or 1 when a host could not start or a neighbour's result was
// wrong or lost.
int runaway_drill(const RunawayDrillParams& p, const HostOptions& base);

}  // namespace outrun::perf
