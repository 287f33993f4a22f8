// The seams where a test build of the worker changes what it does. The shipped outrun-worker
// links no_hooks.cpp, so it has none: each seam costs one compare of a null pointer. The test
// worker, outrun-test-worker (tests/worker_faults/, built next to outrun-worker, never installed),
// links the test faults instead; they are what makes its misbehaviour for the tests and for
// `outrun drill garbage|crash-loop` (design/drills.md, "Test faults in the worker").
#pragma once

#include <string>

namespace outrun::wire {
struct Evaluation;
}

namespace outrun::worker {

class Worker;

struct Hooks {
  // Before each evaluation runs; true: the hook dealt with it (answered it, or never returns).
  bool (*evaluation)(Worker& worker, const wire::Evaluation* e) = nullptr;
  // After the evaluations of each read were answered.
  void (*batch_done)(Worker& worker) = nullptr;
  // The compile-only process (compile_only.h), after each successful compile: may change the
  // bytecode it is about to send.
  void (*compiled)(std::string* bytecode) = nullptr;
};

// Called once by main(), after the status page is mapped and before confinement (so a hook may
// still look at files): the hooks this build has, or null. May end the process.
const Hooks* start_hooks();

}  // namespace outrun::worker
