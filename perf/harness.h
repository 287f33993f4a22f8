// What outrun-perf's host sections share: the inputs and the checks of their results, setup
// checks, waiting for a restarted shard, one batch over many scripts, the 40-line tag scripts,
// and the paced open-loop load over a set of scripts.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "floors.h"
#include "measure.h"
#include "outrun/host.h"
#include "outrun/runner.h"

namespace outrun::perf {

// The inputs of send i: a = input_a(i), b = a + 1.
int64_t input_a(int64_t i);
Inputs inputs_for(int64_t i);

// A setup call (register, kill_shard) that cannot fail with a valid configuration: false, and
// the error on stderr, when it did. The caller counts it wrong (a script that did not register
// ends its evaluations invalid_argument, which check() counts wrong too).
bool setup_ok(const Error& e, const std::string& what);

// True the first time only: the first wrong result of a run is printed, not the others.
bool first_wrong_report();

// The result of kScript ((a + b) / 2) for inputs_for(i); a wrong one on stderr (the first).
bool check(const Result& r, int64_t i);

// The largest RSS among `pids`, MB.
double max_rss_mb(const std::vector<int>& pids);

// Waits until shard `i` has started a worker after `starts` (bounded: 10 s).
bool wait_restarted(const Host& h, int i, uint64_t starts);
// Waits (up to 10 s) until shard i has a worker running. False on timeout.
bool wait_running(const Host& h, int i);

// Evaluates every script of `s` once (one batch) with inputs {a = round, b = 0}; returns the
// ones not ok, or, with `expect`, the ones whose value is not expect(k) (k: index in `s`), and
// those without a result after `wait`.
using Expect = std::function<Value(std::size_t k)>;
int64_t run_all(Host& h, const std::vector<Script>& s, int64_t round, const Expect& expect = {},
                std::chrono::seconds wait = std::chrono::seconds(60));

// A 40-line script, as the brief's compile figure assumes: tag_source(i) returns
// b + the sum of l over 0 <= l < 38 with a > 7 l + i, which tag_value gives.
std::string tag_source(int i);
int64_t tag_value(int i, int64_t a, int64_t b);

// Open loop at `rate` (pacing in measure.h): send i evaluates s[pick(i)] with inputs_for(i),
// callbacks (dispatcher threads for the host), and ok(result, i) judges its result.
template <class Pick, class Ok>
PacedFig paced_load(Runner& r, const std::vector<Script>& s, double rate, double warmup_s,
                    double duration_s, const std::vector<int>& pids, WindowHooks hooks, Pick pick,
                    Ok ok) {
  Paced p(rate, warmup_s, duration_s);
  Window w;
  w.pids = pids;
  // The callback holds one pointer and i, as small as std::function stores without allocating.
  struct Done {
    Paced* p;
    Ok* ok;
  } done{&p, &ok};
  const bool drained = p.run(
      [&](int64_t i) {
        r.evaluate(s[pick(i)], inputs_for(i),
                   [d = &done, i](Result res) { d->p->complete(i, (*d->ok)(res, i)); });
      },
      [&] {
        hooks.start();
        w.start();
      });
  w.stop();
  hooks.stop();
  return paced_fig(p, w, drained);
}

}  // namespace outrun::perf
