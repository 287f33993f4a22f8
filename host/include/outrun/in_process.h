// outrun::InProcess: the same sandboxed engine, inside the calling process.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "outrun/runner.h"

namespace outrun {

struct InProcessOptions {
  // Soft limit per evaluation (the same instruction-count hook as in the workers). There is no
  // hard kill in-process: a script stuck in one C call stalls its caller. Trusted scripts only.
  std::chrono::milliseconds timeout{100};
  // Bytes one script's Lua state may hold.
  std::size_t memory_limit = 16u << 20;
};

// The baseline every out-of-process figure is compared with, and a mode for trusted scripts
// only. evaluate() runs the script on the calling thread and calls `done` before returning.
// Different scripts may run concurrently from different threads; one script's evaluations are
// serialised.
//
// Trusted only, because the sandbox is the only line here: there is no worker process to lose, no
// hard kill at T+G, no confinement, no quarantine. A script that reaches an interpreter bug
// crashes the application itself: Lua 5.4.4's `coroutine.close` nesting bug (a chain of ~12,000
// closes overflows the C stack) segfaulted this process until the sandbox guarded it
// (design/sandbox.md), and any bug like it found later would do the same. Out of process
// (outrun::Host) the same script costs one worker, which is restarted, and the script is
// quarantined.
class InProcess final : public Runner {
 public:
  explicit InProcess(const InProcessOptions& options = {});
  ~InProcess() override;

  Error register_script(std::string_view key, std::string_view source, Script* out) override;
  Error unregister_script(std::string_view key) override;
  void evaluate(const Script& script, Inputs inputs, Callback done) override;
  Future evaluate(const Script& script, Inputs inputs) override;
  Result evaluate_sync(const Script& script, Inputs inputs) override;  // runs it here
  void evaluate_batch(std::vector<Request> requests, BatchCallback done) override;

  // Runs one evaluation synchronously (what evaluate() does, without a callback).
  Result run(const Script& script, const Inputs& inputs);

  // Records alive and what they cost (tests, statistics).
  RegistryStats registry_stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace outrun
