// outrun-perf's scale section (design/budgets.md "Scale rows"): N registered scripts in total
// over every shard (10,000 and 100,000 by default), each N on a fresh Host with the default
// worker_script_budget: registration, a cold first run of all, the workers' RSS, a paced load
// spread over all N, a warm restart of shard 0, and every shard killed at once -> every script's
// next result.
#pragma once

#include <functional>
#include <vector>

#include "outrun/host.h"
#include "report.h"

namespace outrun::perf {

struct ScaleParams {
  std::vector<int> sizes = {10000, 100000};  // N: scripts registered, over every shard
  double rate = 10000;                       // the paced load, evaluations/s
  double warmup_s = 0.5, duration_s = 5;
};

// Adds scale.<N>.* figures to `f`, for each N of p.sizes; false when a host could not start.
// `count(checked, wrong)` is told the results checked.
bool scale_section(const ScaleParams& p, const HostOptions& ho, Figs& f,
                   const std::function<void(double, double)>& count);

}  // namespace outrun::perf
