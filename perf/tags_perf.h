// outrun-perf's tags section (design/budgets.md "tags"): 1,000 virtual tags three levels deep,
// driven by paced source updates; update -> change-callback latency and on-CPU per update, over
// a Host, the same with keep_state, and over InProcess, in the same run.
#pragma once

#include <functional>
#include <string>

#include "outrun/host.h"
#include "report.h"

namespace outrun::perf {

struct TagsParams {
  double rate = 10000;  // source updates per second
  double warmup_s = 1, duration_s = 4;
  int groups = 250;  // 4 tags per group: A = 2s, B = s + 1 (level 1), C = A + B (2), D = C / 2 (3)
  // Not empty: also the keep_state run with outrund's state store in this directory (a fresh
  // file each run; tags.state_store_*).
  std::string state_dir;
};

// Adds tags.* figures to `f`; false when the host could not start.
// `count(checked, wrong)` is told the results checked.
bool tags_section(const TagsParams& p, const HostOptions& ho, Figs& f,
                  const std::function<void(double, double)>& count);

}  // namespace outrun::perf
