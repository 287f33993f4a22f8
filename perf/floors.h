// The floors of this machine, measured in the same run as everything else (BRIEF §5): what a
// round trip between two processes costs, and what the bare shape of the design costs in host CPU
// at a given rate, with nothing of outrun in it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "latency_histogram.h"

namespace outrun::perf {

struct LatencyFig {
  double p50_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
  uint64_t n = 0;
};
LatencyFig latency_of(const LatencyHistogram& h);

// Start/stop of a measured window (profilers hook in here).
struct WindowHooks {
  std::function<void()> start = [] {};
  std::function<void()> stop = [] {};
};

// One thread of this process over a window.
struct ThreadFig {
  int tid = 0;
  bool main = false;  // the main thread: the pacing (caller) thread of a paced run
  double cpu_pct = 0;
  double wakeups_per_msg = 0;
};

// An open-loop paced run: on-CPU time of this process over the measured window, latency from
// the intended send times, results checked.
struct PacedFig {
  double cpu_pct = 0;        // this process, % of one core
  double us_per_msg = 0;     // this process's on-CPU µs per message
  double other_cpu_pct = 0;  // the other process(es) of the shape (echo child, workers, redis)
  double other_us_per_msg = 0;
  double wakeups_per_msg = 0;        // this process: times its threads were scheduled in
  double other_wakeups_per_msg = 0;  // the other process(es)
  std::vector<ThreadFig> threads;    // this process, by CPU, largest first
  double achieved_per_s = 0;         // measured messages / window
  LatencyFig lat;
  int64_t measured = 0;
  int64_t wrong = 0;  // wrong answers, or sends that never completed
};

class Paced;
struct Window;
// The figures of a finished paced run (`drained`: every send completed).
PacedFig paced_fig(const Paced& p, const Window& w, bool drained);
std::vector<ThreadFig> thread_figs(const Window& w, int64_t messages);

// Blocking 64-byte round trips with a forked echo process over a socketpair.
LatencyFig pipe_round_trip(int iterations);

// Only the pacing thread, waking at every intended send time and doing nothing.
PacedFig pacing_only(double rate, double warmup_s, double duration_s);

// The bare shape: the pacing thread writes 64 bytes per send into a socketpair, an echo child
// process answers, an epoll thread reads the answers; with `dispatcher_hop` the epoll thread
// hands them to a dispatcher thread through a mutex + condition variable (woken at most once per
// read, as the host's dispatcher is). `two_pipes`: two one-way pipes instead of one socketpair
// (on a socketpair, consuming what the echo wrote also wakes the echo where it waits to read).
PacedFig bare_shape(double rate, double warmup_s, double duration_s, bool dispatcher_hop,
                    WindowHooks hooks = {}, bool two_pipes = false);

}  // namespace outrun::perf
