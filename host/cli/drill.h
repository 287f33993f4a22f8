// outrun drill: resilience drills against a live outrund (design/drills.md).
#pragma once

#include <string>
#include <vector>

namespace outrun::cli {

struct DrillArgs {
  std::string name;        // kill-one, kill-all, hang, runaway, crash-loop, garbage, memory
  int rate = 2000;         // evaluations per second, open loop
  double duration_s = 10;  // of the load; the fault comes at a third of it
  int shards = 2;          // of the private outrund
  bool shards_given = false;
  bool json = false;
  std::string socket;   // a running outrund; empty: the drill starts a private one
  std::string outrund;  // the daemon binary for the private one (default: next to this one)
};

// The drills `outrun drill` knows, in the order `outrun drill --help` lists them.
const std::vector<std::string>& drill_names();

// Runs one drill and prints its report. Exit code: 0 when nothing was lost, duplicated or
// wrong, the fault happened and every shard served again; 1 otherwise; 2 for bad arguments;
// 3 when the daemon cannot be reached or started.
int run_drill(const DrillArgs& args);

}  // namespace outrun::cli
